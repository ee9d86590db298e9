"""The plugin API: ``cfl.plugin`` holds every name the guide's examples import, the guide's reference table lists
exactly the hooks of ``Method``, the model's mode in ``client_end`` is the one the table states, and the packages
keep their layers (methods import the interface only; metrics, reports and records import no engine)."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import cfl.plugin
from cfl.methods import METHODS
from cfl.methods.base import Method
from tests.conftest import make_stream

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))


def _hooks_of_method() -> set[str]:
    return {name for name, value in vars(Method).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, classmethod))}


def _reference_rows() -> set[str]:
    section = GUIDE.read_text().split("## Reference: every hook", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))


def test_reference_table_lists_exactly_the_hooks_of_method():
    hooks = _hooks_of_method()
    probe = {"round_terms", "client_start", "carry_step", "client_end", "server_update", "count_bytes"}
    assert probe <= hooks  # the probe sees hooks
    assert _reference_rows() == hooks


def _cfl_imports(tree: ast.AST) -> list[tuple[str, str]]:
    return [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.split(".")[0] == "cfl" for alias in node.names]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_import_every_cfl_name_from_the_plugin_module(path):
    imported = _cfl_imports(ast.parse(path.read_text()))
    assert imported, path
    assert {module for module, _ in imported} == {"cfl.plugin"}, imported
    assert all(hasattr(cfl.plugin, name) for _, name in imported)


def test_plugin_module_exports_what_it_lists():
    assert sorted(cfl.plugin.__all__) == sorted(set(cfl.plugin.__all__))
    assert all(hasattr(cfl.plugin, name) for name in cfl.plugin.__all__)
    assert cfl.plugin.Method is Method and cfl.plugin.METHODS is METHODS


#: package -> packages it must never import (the layers: records below metrics, both below the engine)
NEVER = {
    "cfl/methods": ("cfl.engine", "cfl.metrics", "cfl.records", "cfl.report"),
    "cfl/records": ("cfl.engine", "cfl.metrics", "cfl.report"),
    "cfl/metrics": ("cfl.engine", "cfl.report"),
    "cfl/report": ("cfl.engine",),
    "cfl/plugin.py": ("cfl.engine", "cfl.metrics", "cfl.records", "cfl.report"),
}


@pytest.mark.parametrize("package", sorted(NEVER))
def test_packages_do_not_import_up_their_layers(package):
    files = [ROOT / package] if package.endswith(".py") else sorted((ROOT / package).glob("*.py"))
    wrong = [(f.name, module) for f in files for module, _ in _cfl_imports(ast.parse(f.read_text()))
             if module.startswith(NEVER[package])]
    assert not wrong


def test_client_end_sees_the_template_model_in_eval_mode_at_both_events():
    """The trainer leaves the model in train mode and the evaluation in eval mode: ``client_end`` ran in train
    mode after rounds and in eval mode at task ends before the engine set eval mode for both."""
    from cfl.engine.rounds.runner import Runner
    from cfl.validation import from_dict

    seen: list[tuple[str, bool]] = []

    class Probe(Method):
        name = "mode-probe"

        def client_end(self, ctx):
            event, model = ctx.event, ctx.model
            seen.append((event, model.training))

    with METHODS.preserved():
        cfl.plugin.register(Probe)
        cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8,
                         "wandb": {"mode": "disabled"}, "method": {"name": "mode-probe"}})
        Runner(cfg, make_stream("task", num_tasks=2)).run()
    assert {event for event, _ in seen} == {"round", "task_end"}
    assert not any(training for _, training in seen), seen
