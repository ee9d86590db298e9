"""``cfl.streams.register``: argument checks, name clashes, temporary registration, builders checked against
their registration, and the own-dataset guide's plugin (docs/examples/own_dataset.py) through ``--plugin``
for ``cfl list``, ``cfl run``, ``cfl run --resume``, ``cfl sweep`` and sweep workers."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cfl import plugin_files as plugins
from cfl.app.cli import main
from cfl.app.sweep import run_job
from cfl.config.keys import ConfigError
from cfl.data.load import load_stream
from cfl.data.stream_registry import STREAMS
from cfl.streams import register, registered, unregister
from cfl.validation import from_dict
from tests.conftest import make_stream

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "own_dataset.py"
TINY = {"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 16,
        "wandb": {"mode": "disabled"}}
META = {"tasks": 2, "scenarios": ("task",), "input_shape": (12,), "classes_per_task": 3,
        "default_model": "digits-mlp"}


@pytest.fixture(autouse=True)
def _registry_restored(monkeypatch):
    """Registering (and a plugin file imported once per process) must not leak into later tests."""
    monkeypatch.setattr(plugins, "LOADED", dict(plugins.LOADED))
    with STREAMS.preserved():
        yield


def _blobs(request):
    return make_stream(request.scenario, request.num_tasks)


@pytest.mark.parametrize(("change", "words"), [
    ({"name": "has space"}, ["letters, digits"]),
    ({"name": "split-digits"}, ["'split-digits' is already registered", "another name"]),
    ({"build": 3}, ["build must be a callable"]),
    ({"scenarios": ("task", "online")}, ["scenarios", "among"]),
    ({"scenarios": ()}, ["scenarios"]),
    ({"tasks": 0}, ["tasks must be a positive integer"]),
    ({"classes_per_task": 2.5}, ["classes_per_task must be a positive integer"]),
    ({"input_shape": (12, -1)}, ["input_shape must be a tuple of positive integers"]),
    ({"default_model": "nope"}, ["default_model 'nope' is not a model", "digits-mlp"]),
    ({"default_model": "alexnet"}, ["default_model 'alexnet' does not take inputs (12,)"]),
])
def test_register_refuses_bad_arguments_and_leaves_the_registry_as_it_was(change, words):
    before = dict(STREAMS)
    args = {"name": "mine", "build": _blobs, **META, **change}
    name, build = args.pop("name"), args.pop("build")
    with pytest.raises(ConfigError) as err:
        register(name, build, **args)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert STREAMS == before


def test_registered_is_temporary_and_a_registered_stream_runs_from_a_config():
    with registered("mine", _blobs, **META):
        cfg = from_dict({"stream": {"name": "mine", "num_tasks": 1}, **TINY})
        assert cfg.model.name == "digits-mlp"
        stream = load_stream(**cfg.stream_fields())
        assert stream.num_tasks == 1 and stream.input_shape == (12,)
        with pytest.raises(ConfigError, match="scenario: class' is not supported by stream 'mine'"):
            from_dict({"stream": {"name": "mine", "scenario": "class"}, **TINY})
    assert "mine" not in STREAMS
    with pytest.raises(ConfigError, match="not registered"):
        unregister("mine")


@pytest.mark.parametrize(("build", "words"), [
    (lambda _request: "tensors", "returned str, not a cfl Stream"),
    (lambda _request: make_stream("task", 2), "returned 2 tasks for num_tasks 1"),
    (lambda request: make_stream("domain", request.num_tasks), "returned a domain-incremental stream"),
    (lambda request: make_stream("task", request.num_tasks, dim=5), "inputs of shape (5,)"),
])
def test_a_builder_that_breaks_its_registration_is_refused_at_load(build, words):
    with registered("mine", build, **META):
        cfg = from_dict({"stream": {"name": "mine", "num_tasks": 1}, **TINY})
        with pytest.raises(ConfigError, match="stream 'mine': its builder") as err:
            load_stream(**cfg.stream_fields())
    assert words in str(err.value)


def test_guide_shows_the_example_verbatim_in_under_30_lines():
    text = EXAMPLE.read_text()
    assert text in (ROOT / "docs" / "own-dataset.md").read_text()
    assert len(text.splitlines()) < 30


def _config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps({"stream": {"name": "blobs-3x2", "num_tasks": 2}, **TINY, **extra}))
    return path


def test_plugin_stream_through_list_run_and_resume(tmp_path, capsys):
    assert main(["list", "--plugin", str(EXAMPLE)]) == 0
    assert "blobs-3x2" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(["run", str(_config(tmp_path)), "--out", str(out), "--quiet", "--plugin", str(EXAMPLE)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["stream"] == "blobs-3x2" and results["num_tasks"] == 2
    unregister("blobs-3x2")
    plugins.LOADED.clear()  # as in a new process
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "needs the same --plugin to resume" in capsys.readouterr().err
    assert main(["run", "--resume", str(out), "--quiet", "--plugin", str(EXAMPLE)]) == 0


def test_plugin_stream_through_a_sweep(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(json.dumps({"base": str(_config(tmp_path)), "grid": {"lr": [0.05, 0.1]},
                                 "out": str(tmp_path / "sweep")}))
    assert main(["sweep", str(sweep)]) == 2
    assert "unknown stream 'stream.name: blobs-3x2'" in capsys.readouterr().err
    assert main(["sweep", str(sweep), "--plugin", str(EXAMPLE)]) == 0
    assert len(list((tmp_path / "sweep").glob("*/results.json"))) == 2


def test_a_sweep_worker_imports_the_plugin_from_its_text(tmp_path):
    """What a --jobs worker or a Ray worker gets: the file's name and text, not a path it may not have."""
    sources = plugins.load_plugins([str(EXAMPLE)])
    cfg = from_dict({"stream": {"name": "blobs-3x2", "num_tasks": 1}, **TINY})
    unregister("blobs-3x2")
    plugins.LOADED.clear()  # a fresh worker process
    shipped = pickle.loads(pickle.dumps(tuple(sources)))
    outcome = run_job(cfg, tmp_path / "w", plugins=shipped)
    assert isinstance(outcome, dict) and outcome["stream"] == "blobs-3x2", outcome
    assert run_job(cfg, tmp_path / "w2", plugins=shipped)["stream"] == "blobs-3x2"  # imported once per worker


def test_plugin_classes_pickle_by_value_for_ray_workers():
    """``backend: ray`` sends method objects to workers, which cannot import ``cfl_plugin_*`` modules;
    ``ship_to_ray`` has Ray's cloudpickle (here the same library, standalone) pickle them by value."""
    cloudpickle = pytest.importorskip("cloudpickle")
    plugins.load_plugins([str(EXAMPLE)])
    module = sys.modules["cfl_plugin_own_dataset"]
    plugins.ship_to_ray(SimpleNamespace(cloudpickle=cloudpickle))
    try:
        data = cloudpickle.dumps(module.build)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    del sys.modules["cfl_plugin_own_dataset"]  # as on a worker
    try:
        build = pickle.loads(data)
    finally:
        sys.modules["cfl_plugin_own_dataset"] = module
    assert build is not module.build and build(SimpleNamespace(scenario="task", num_tasks=1)).num_tasks == 1
