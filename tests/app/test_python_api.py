"""``cfl.run``/``cfl.resume``: config as path, dict or Config; overrides as ``--set``; validation before any
file; the same outputs as the CLI; ``stream=`` objects; and docs/python-api.md's examples, run in order."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cfl
from cfl.data.stream_registry import STREAMS
from cfl.methods import METHODS
from cfl.redefinition import ReplacedRegistration
from cfl.validation import load_config
from tests.conftest import make_stream

ROOT = Path(__file__).resolve().parents[2]
TINY = {"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8,
        "wandb": {"mode": "disabled"}}


def test_import_cfl_is_cheap():
    code = ("import sys, cfl; heavy = [m for m in ('torch', 'avalanche', 'wandb', 'matplotlib') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_run_from_a_dict_with_overrides_writes_the_cli_outputs_and_returns_results_json(tmp_path):
    config = {"stream": {"name": "split-digits", "num_tasks": 2}, **TINY}
    given = json.dumps(config)
    results = cfl.run(config, overrides={"method.name": "fedprox", "method.mu": 0.5}, out=tmp_path / "r")
    assert json.dumps(config) == given  # the caller's dict is not changed
    assert results == json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["method"] == "fedprox" and results["num_tasks"] == 2
    saved = (tmp_path / "r" / "config.yaml").read_text()
    assert "mu: 0.5" in saved
    for name in ("metrics.jsonl", "acc_matrix.png"):
        assert (tmp_path / "r" / name).is_file()


def test_run_returns_its_directory_and_the_curves_of_its_evaluations(tmp_path):
    config = {"stream": {"name": "split-digits", "num_tasks": 2}, **TINY, "rounds_per_task": 3, "eval_every": 2}
    results = cfl.run(config, out=tmp_path / "r")
    assert results.run_dir == tmp_path / "r" and isinstance(results, dict)
    assert dict(results) == json.loads((tmp_path / "r" / "results.json").read_text())
    lines = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [e for e in lines if e["kind"] == "evaluation"]
    curves = results.curves  # 3 rounds per task, evaluated after round 2 of each task and at its end
    assert curves.round == [2, 3, 5, 6] == [e["round"] for e in evaluations]
    assert curves.task == [0, 0, 1, 1] and curves.final == [False, True, False, True]
    assert curves.mean_acc == [e["mean_acc"] for e in evaluations]
    assert len(curves.acc) == 2 and curves.acc[1][:2] == [None, None]
    assert curves.acc == [[e["acc"]["0"] for e in evaluations], [None, None, *(e["acc"]["1"] for e in evaluations[2:])]]
    assert [[curves.acc[j][i] for j in range(2)] for i in (1, 3)] == results["acc_matrix"]
    again = cfl.resume(tmp_path / "r")  # a finished run: its results and curves again
    assert again["acc_matrix"] == results["acc_matrix"] and again.curves == curves and again.run_dir == results.run_dir


def test_run_from_a_path_and_from_a_config_object(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps({"stream": {"name": "split-digits", "num_tasks": 1}, **TINY}))
    a = cfl.run(path, out=tmp_path / "a")
    cfg = load_config(path)
    b = cfl.run(cfg, out=tmp_path / "b")
    assert a["acc_matrix"] == b["acc_matrix"] and a["num_tasks"] == 1


@pytest.mark.parametrize(("overrides", "words"), [
    ({"method.name": "fedavgg"}, "unknown method 'method.name: fedavgg'"),
    ({"rounds_per_task": 0}, "rounds_per_task"),
    ({"": 1}, "malformed override key"),
    (["lr=0.1"], "overrides must be a mapping"),
])
def test_bad_overrides_raise_config_error_before_any_file(tmp_path, overrides, words):
    with pytest.raises(cfl.ConfigError, match=re.escape(words)):
        cfl.run({"stream": {"name": "split-digits", "num_tasks": 1}, **TINY}, overrides=overrides,
                out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_stream_object_replaces_the_data_and_is_registered_for_the_call_only(tmp_path):
    stream = make_stream("task", num_tasks=3)
    first = stream.tasks[0]
    results = cfl.run({"stream": {"name": "split-digits"}, **TINY}, overrides={"stream.num_tasks": 2},
                      out=tmp_path / "r", stream=stream)
    assert results["stream"] == "blobs" and results["num_tasks"] == 2
    assert "blobs" not in STREAMS and stream.tasks[0] is first and "fingerprint" not in stream.info
    saved = (tmp_path / "r" / "config.yaml").read_text()
    assert "name: blobs" in saved and "name: digits-mlp" in saved  # model: auto is the stream's default_model


@pytest.mark.parametrize(("stream", "overrides", "words"), [
    (make_stream("task", num_tasks=2), {"model.name": "alexnet"}, "does not fit stream 'blobs' (inputs (12,))"),
    (make_stream("task", num_tasks=2), {"stream.num_tasks": 3}, "stream 'blobs' has 2 tasks"),
    (make_stream("task", num_tasks=2), {"stream.scenario": "class"}, "not supported by stream 'blobs'"),
    ("split-digits", {}, "stream= takes a cfl Stream"),
])
def test_stream_object_refusals(tmp_path, stream, overrides, words):
    with pytest.raises(cfl.ConfigError, match=re.escape(words)):
        cfl.run(TINY, overrides=overrides, out=tmp_path / "r", stream=stream)
    assert not (tmp_path / "r").exists() and "blobs" not in STREAMS


def test_a_stream_named_like_a_registered_one_is_refused(tmp_path):
    stream = make_stream("task", num_tasks=2)
    stream.name = "split-digits"
    with pytest.raises(cfl.ConfigError, match="'split-digits' is already registered"):
        cfl.run(TINY, out=tmp_path / "r", stream=stream)


def test_resume_needs_the_same_stream(tmp_path):
    stream = make_stream("task", num_tasks=2)
    done = cfl.run(TINY, out=tmp_path / "r", stream=stream)
    with pytest.raises(cfl.ConfigError, match=re.escape("resumes with cfl.resume(")):
        cfl.resume(tmp_path / "r")
    with pytest.raises(cfl.ConfigError, match="not the data this run was trained on.*pass the Stream object"):
        cfl.resume(tmp_path / "r", stream=make_stream("task", num_tasks=2, seed=7))
    other = make_stream("task", num_tasks=2)
    other.name = "other"
    with pytest.raises(cfl.ConfigError, match="trained on stream 'blobs', but stream= is 'other'"):
        cfl.resume(tmp_path / "r", stream=other)
    assert cfl.resume(tmp_path / "r", stream=stream)["acc"] == done["acc"]


def test_the_guide_examples_run_in_order(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 6
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}  # as in a notebook
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), METHODS.preserved():
        for block in blocks:
            exec(compile(block, "docs/python-api.md", "exec", dont_inherit=True), namespace)  # noqa: S102
        with pytest.warns(ReplacedRegistration, match="method 'strong-prox' registered again"):
            exec(compile(blocks[-1], "docs/python-api.md", "exec", dont_inherit=True), namespace)  # noqa: S102
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("ewc: ACC ") and lines[1] == "runs/api-ewc [2, 4] [True, True] [True, False]"
    assert lines[2].startswith("unknown method 'method.name: fedavgg'")
    assert lines[3].startswith("my-pairs 3 ACC ")
    assert lines[4] == lines[5] == "{'name': 'strong-prox', 'mu': 0.5}"
    assert (tmp_path / "runs" / "api-pairs" / "results.json").is_file()
    assert not (tmp_path / "runs" / "api-typo").exists()


@pytest.mark.parametrize(("call", "words"), [
    (lambda _: cfl.run({"stream": {"name": "split-digits"}, **TINY}, out=5),
     "out must be a str or pathlib.Path (or None), got int 5"),
    (lambda _: cfl.resume(5), "run_dir must be a str or pathlib.Path, got int 5"),
    (lambda tmp: cfl.run({"stream": {"name": "split-digits"}, **TINY}, out=tmp / "r", plugins="x.py"),
     "plugins must be a list of plugin file paths, got the str 'x.py'; pass a list: plugins=['x.py']"),
    (lambda tmp: cfl.resume(tmp / "r", plugins=[3]), "plugins must be a list of plugin file paths (str or "
     "pathlib.Path); it holds int 3"),
], ids=["out=5", "resume(5)", "plugins='x.py'", "plugins=[3]"])
def test_arguments_of_another_type_raise_type_error_naming_them(tmp_path, call, words):
    """ These used to fail deep inside (Path(5)) or read 'x.py' as the files 'x', '.', ..."""
    with pytest.raises(TypeError, match=re.escape(words)):
        call(tmp_path)
    assert not list(tmp_path.iterdir())
