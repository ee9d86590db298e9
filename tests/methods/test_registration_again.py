"""Registering a taken name again (docs/python-api.md, "Registering again"): the same definition (a re-run
notebook cell, an edited plugin file given to ``cfl.run`` again) replaces the entry with a warning and the new one
is what runs; any other definition under a taken name is refused, whichever registry."""

from __future__ import annotations

import contextlib
import re
import sys
import textwrap

import pytest

import cfl
from cfl import plugin_files as plugins
from cfl.data.stream_registry import STREAMS
from cfl.methods import METHODS
from cfl.methods.fedavg import FedAvg
from cfl.redefinition import ReplacedRegistration
from cfl.registry import Registry

ONE_ROUND = {"stream": {"name": "split-digits", "num_tasks": 1}, "num_clients": 2, "clients_per_round": 2,
             "rounds_per_task": 1, "batch_size": 32, "threads": 1, "wandb": {"mode": "disabled"}}


def cell(mu: float, name: str = "nb-prox") -> str:
    """A notebook cell that defines a FedProx variant with default ``mu`` and registers it under ``name``."""
    return textwrap.dedent(f"""
        from dataclasses import dataclass

        from cfl.methods import register
        from cfl.methods.fedprox import FedProx
        from cfl.config.schema import field


        @dataclass(frozen=True)
        class NbProxHyperparams:
            mu: float = field({mu}, "weight of the proximal term", min=0.0)


        @register
        class NbProx(FedProx):
            name = {name!r}
            about = "FedProx, written in a notebook"
            Hyperparams = NbProxHyperparams
        """)


def run_cell(source: str, module: str = "__main__") -> dict:
    """Run ``source`` as a notebook runs a cell: in the namespace of module ``module``."""
    namespace = {"__name__": module}
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)  # noqa: S102 -- our own cell
    return namespace


@pytest.fixture
def methods():
    """METHODS, restored after the test."""
    with METHODS.preserved():
        yield METHODS


def test_a_cell_run_again_replaces_its_method_with_a_warning_and_the_run_uses_the_new_one(methods, tmp_path):
    run_cell(cell(0.25))
    with pytest.warns(ReplacedRegistration, match=re.escape("method 'nb-prox' registered again by the same "
                                                            "definition (NbProx in ")):
        second = run_cell(cell(0.75))
    assert methods["nb-prox"] is second["NbProx"] and list(methods).count("nb-prox") == 1
    results = cfl.run(ONE_ROUND, overrides={"method.name": "nb-prox"}, out=tmp_path / "r")
    assert results["config"]["method"] == {"name": "nb-prox", "mu": 0.75}


def test_the_same_class_registered_twice_is_said_once_per_time(methods):
    first = run_cell(cell(0.25))
    with pytest.warns(ReplacedRegistration) as said:
        run_cell(cell(0.25))
        run_cell(cell(0.25))  # the same text again: said again, not deduplicated as warnings usually are
    assert len(said) == 2
    from cfl.methods import register
    with pytest.warns(ReplacedRegistration):
        register(first["NbProx"])  # an earlier class object of the same definition: that one again
    assert methods["nb-prox"] is first["NbProx"]


@pytest.mark.parametrize(("source", "module", "words"), [
    (cell(0.5), "other_notebook", ["method 'nb-prox' is already registered (by NbProx in ",
                                   "NbProx in module other_notebook is another definition)", "choose another name"]),
    (cell(0.5).replace("class NbProx(", "class Renamed("), "__main__",
     ["(by NbProx in ", "Renamed in ", "is another definition"]),
    (cell(0.5, name="fedavg"), "__main__", ["method 'fedavg' is already registered (by FedAvg in ",
                                            "fedavg.py; NbProx in ", "choose another name",
                                            "Only the same class or function defined again"]),
])
def test_another_definition_under_a_taken_name_is_refused(methods, source, module, words):
    before = run_cell(cell(0.25))["NbProx"]
    with pytest.raises(cfl.ConfigError) as err:
        run_cell(source, module)
    for word in words:
        assert word in str(err.value), str(err.value)
    assert methods["nb-prox"] is before and methods["fedavg"] is FedAvg


def test_cfl_run_imports_an_edited_plugin_file_again(methods, tmp_path, monkeypatch):
    monkeypatch.setattr(plugins, "LOADED", {})
    monkeypatch.delitem(sys.modules, "cfl_plugin_nb_edited", raising=False)
    file = tmp_path / "nb_edited.py"
    mus = []
    for step, mu in enumerate((0.25, 0.75, 0.25)):  # edited, then edited back: each text runs
        file.write_text(cell(mu))
        said = pytest.warns(ReplacedRegistration, match=re.escape(f"(NbProx in {file})"))
        with said if step else contextlib.nullcontext():
            results = cfl.run(ONE_ROUND, overrides={"method.name": "nb-prox"}, out=tmp_path / f"r{step}",
                              plugins=[str(file)])
        mus.append(results["config"]["method"]["mu"])
        assert [key[0] for key in plugins.LOADED] == [str(file)]  # only the file's last text is kept
    assert mus == [0.25, 0.75, 0.25]
    broken = cell(0.5) + cell(0.5, name="nb-other") + "\nraise RuntimeError('typo')\n"
    file.write_text(broken)  # a broken edit: refused, leaving nothing of its own registered
    with pytest.warns(ReplacedRegistration), pytest.raises(cfl.ConfigError, match="RuntimeError: typo"):
        cfl.run(ONE_ROUND, out=tmp_path / "broken", plugins=[str(file)])
    assert sys.modules["cfl_plugin_nb_edited"] is next(iter(plugins.LOADED.values()))
    assert methods["nb-prox"].Hyperparams().mu == 0.25 and "nb-other" not in methods


@pytest.mark.usefixtures("methods")
def test_another_plugin_file_cannot_take_a_registered_name(tmp_path, monkeypatch):
    monkeypatch.setattr(plugins, "LOADED", {})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "nb_twice.py").write_text(cell(0.25))
    plugins.load_plugins([str(tmp_path / "a" / "nb_twice.py")])
    with pytest.raises(cfl.ConfigError, match=re.escape(f"NbProx in {tmp_path}/a/nb_twice.py; NbProx in "
                                                        f"{tmp_path}/b/nb_twice.py is another definition")):
        plugins.load_plugins([str(tmp_path / "b" / "nb_twice.py")])


def test_every_registry_follows_the_same_rule():
    reg: Registry[object] = Registry("rule")
    source = "def halve(x):\n    return x / {}\n"
    first = run_cell(source.format(2))["halve"]
    reg.register("halve", first)
    with pytest.warns(ReplacedRegistration, match="rule 'halve' registered again by the same definition"):
        reg.register("halve", run_cell(source.format(4))["halve"])
    assert reg["halve"](8) == 2
    with pytest.raises(cfl.ConfigError, match="'halve' is already registered .*is another definition"):
        reg.register("halve", run_cell(source.format(8), "elsewhere")["halve"])
    reg.register("one", 1)
    with pytest.raises(cfl.ConfigError, match="rule 'one' is already registered; choose another name"):
        reg.register("one", 2)  # a value has no definition: never the same as another
    with pytest.raises(cfl.ConfigError, match="'halve' is already registered"), reg.temporarily("halve", first):
        pytest.fail("a temporary entry replaced a taken name")


def test_a_stream_registered_again_by_the_same_builder_replaces_it():
    source = textwrap.dedent("""
        import cfl.streams
        from tests.conftest import make_stream

        def build(request):
            return make_stream(request.scenario, num_tasks=request.num_tasks)

        cfl.streams.register("nb-blobs", build, tasks=3, scenarios=("task",), input_shape=(12,),
                             classes_per_task={}, default_model="digits-mlp")
        """)
    with STREAMS.preserved():
        run_cell(source.format(2))
        with pytest.warns(ReplacedRegistration, match="stream 'nb-blobs' registered again"):
            run_cell(source.format(3))
        assert STREAMS["nb-blobs"].classes_per_task == 3
        with pytest.raises(cfl.ConfigError, match="stream 'nb-blobs' is already registered .*another definition"):
            run_cell(source.format(2), "elsewhere")
