"""``stream: {name: avalanche, benchmark: ..., args: ...}``: an Avalanche benchmark named in a config runs end to
end (Python API and CLI), is recorded in results.json and the checkpoint, and bad ones exit 2 before any file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import cfl
from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.data.digits import load_digits_tensors
from cfl.report.groups import group_runs, load_runs
from tests.fake_data import write_idx_dataset

pytestmark = pytest.mark.avalanche  # imports avalanche-lib (seconds, once per process)

ROOT = Path(__file__).resolve().parents[2]
DIGITS = "tests.avalanche_benchmarks.digits"
SMALL = {"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 16,
         "wandb": {"mode": "disabled"}}


def config(**stream: object) -> dict:
    return {"stream": {"name": "avalanche", "benchmark": DIGITS, "args": {"n_experiences": 5}, **stream}, **SMALL}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The digits benchmark, 3 of its 5 experiences, run through cfl.run (shared task label: class-incremental)
    and through `cfl run` in a subprocess (a task label per experience: task-incremental)."""
    root = tmp_path_factory.mktemp("avalanche-runs")
    api = cfl.run(config(), overrides={"stream.num_tasks": 3, "stream.args.task_labels": False}, out=root / "api")
    path = root / "digits.yaml"
    path.write_text(yaml.safe_dump(config()))
    cli = subprocess.run([sys.executable, "-m", "cfl", "run", str(path), "--out", str(root / "cli"), "--quiet",
                          "--set", "stream.num_tasks=3", "--set", "stream.args.task_labels=true"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return root, api, cli


def test_the_python_api_runs_the_config_route_with_overrides_of_its_args(runs):
    root, results, _ = runs
    assert (results["stream"], results["scenario"], results["num_tasks"], results["complete"]) == \
        ("avalanche-digits", "class", 3, True)
    assert all(acc is not None for acc in results["acc_matrix"][-1])
    assert results["config"]["stream"] == {"name": "avalanche", "num_tasks": 3, "scenario": "auto", "seed": None,
                                                "download": False, "benchmark": DIGITS,
                                                "args": {"n_experiences": 5, "task_labels": False},
                                                "train_per_class": None, "test_per_class": None}
    assert yaml.safe_load((root / "api" / "config.yaml").read_text())["stream"] == results["config"]["stream"]
    saved = torch.load(root / "api" / "checkpoint.pt", weights_only=True)
    assert saved["config"]["stream"]["args"] == {"n_experiences": 5, "task_labels": False}
    (_, ytr), (_, yte) = load_digits_tensors()  # experience t holds digits 2t and 2t+1, all of them
    assert [f["train"] for f in saved["data"]] == [int(((ytr // 2) == t).sum()) for t in range(3)]
    assert [f["test"] for f in saved["data"]] == [int(((yte // 2) == t).sum()) for t in range(3)]


def test_cfl_run_in_a_subprocess_runs_the_config_route_and_prints_the_conversion(runs):
    root, _, proc = runs
    assert proc.returncode == 0, proc.stderr
    assert f"cfl: {DIGITS}: built in" in proc.stderr and "5 experiences (1797 samples) converted" in proc.stderr
    results = json.loads((root / "cli" / "results.json").read_text())
    assert (results["stream"], results["scenario"], results["num_tasks"]) == ("avalanche-digits", "task", 3)
    assert results["config"]["stream"]["args"] == {"n_experiences": 5, "task_labels": True}


def test_cfl_report_keeps_runs_of_different_benchmark_args_apart(runs):
    root, _, _ = runs
    groups = group_runs(load_runs([root]))
    # task_labels decides the scenario, which the stream column names (cfl/report/labels.py): two rows
    assert sorted((g.stream, g.label) for g in groups) == [("avalanche-digits (class-IL)", "fedavg"),
                                                           ("avalanche-digits (task-IL)", "fedavg")]


def test_resume_refuses_other_benchmark_args_and_continues_with_the_same(runs, tmp_path):
    root, results, _ = runs
    run = shutil.copytree(root / "api", tmp_path / "api")
    assert cfl.resume(run)["acc_matrix"] == results["acc_matrix"]  # same benchmark: same data fingerprint
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["stream"]["args"]["task_labels"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match="stream.args.task_labels: False in the checkpoint, True now"):
        cfl.resume(run)


@pytest.mark.parametrize(("sets", "words"), [
    (["stream.benchmark=tests.no_such_module.digits"], "'tests' has no attribute 'no_such_module' (and there is no "
                                                       "module 'tests.no_such_module')"),
    (["stream.benchmark=no_such_package.make"], "no module 'no_such_package' can be imported; install it, or put "
                                                "the folder holding it on PYTHONPATH"),
    (["stream.benchmark=cfl_test_broken_module.make"], "importing module 'cfl_test_broken_module' failed: "
                                                       "RuntimeError: broken at import"),
    (["stream.benchmark=digits"], "must be a dotted path module.callable"),
    (["stream.benchmark=tests.avalanche_benchmarks.NOT_CALLABLE"], "is not callable (it is of type int)"),
    (["stream.benchmark=tests.avalanche_benchmarks.broken", "stream.args={}"],
     "failed when called with stream.args {}: FileNotFoundError: no such dataset_root: /nowhere"),
    (["stream.benchmark=tests.avalanche_benchmarks.not_a_benchmark", "stream.args={}"],
     "returned a list, not an Avalanche benchmark"),
    (["stream.args.bogus=1"], "failed when called with stream.args {'n_experiences': 5, 'bogus': 1}: TypeError: "),
    (["stream.args.n_experiences=3"], "ValueError: Invalid number of experiences"),
    (["stream.num_tasks=6"], "'stream.num_tasks' is 6 but stream 'avalanche' has 5 tasks"),
    (["stream.benchmark=null"], "'stream.name: avalanche' needs 'stream.benchmark'"),
    (["stream.name=split-digits"], "'stream.benchmark' is read only with 'stream.name: avalanche'"),
    (["stream.seed=1"], "'stream.seed' is not read by 'stream.name: avalanche'"),
    (["stream.download=true"], "'stream.download' is not read by 'stream.name: avalanche'"),
])
def test_bad_benchmarks_exit_2_before_a_run_directory_exists(sets, words, tmp_path, monkeypatch, capsys):
    (tmp_path / "cfl_test_broken_module.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(config()))
    argv = ["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the conversion's line, where one was converted
    assert err.startswith("cfl: config error: ") and words in err, err
    assert not (tmp_path / "run").exists()


def test_validating_other_streams_or_refusing_a_non_benchmark_does_not_import_avalanche():
    code = """
import sys
from cfl.data.load import load_stream
from cfl.validation import from_dict
load_stream(**from_dict({"stream": {"name": "split-digits"}}).stream_fields())
try:
    from_dict({"stream": {"name": "avalanche", "benchmark": "tests.avalanche_benchmarks.not_a_benchmark"}})
except ValueError as err:
    print(err)
print("avalanche" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.splitlines()
    assert out == ["'stream.benchmark: tests.avalanche_benchmarks.not_a_benchmark' returned a list, not an Avalanche "
                   "benchmark (a CLScenario, e.g. from SplitMNIST or nc_benchmark)", "False"]


def test_the_docs_example_runs_splitmnist_from_a_config_on_files_in_its_dataset_root(tmp_path, monkeypatch, capsys):
    """docs/streams.md's config and Python example, on 20 MNIST images per class written where torchvision
    looks for them under the example's dataset_root (so nothing is downloaded)."""
    page = (ROOT / "docs" / "streams.md").read_text()
    section = page.split("## Avalanche in, from a config", 1)[1].split("\n## ", 1)[0]
    (config,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    write_idx_dataset(tmp_path / "data" / "mnist" / "MNIST" / "raw", n_train=200, n_test=100, gz=False)
    (tmp_path / "split-mnist.yaml").write_text(config)
    assert main(["run", "split-mnist.yaml", "--set", "rounds_per_task=1", "--out", "runs/cli", "--quiet"]) == 0
    results = json.loads((tmp_path / "runs" / "cli" / "results.json").read_text())
    assert (results["stream"], results["scenario"], results["num_tasks"]) == ("avalanche-SplitMNIST", "task", 5)
    exec(compile(example, "docs/streams.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[-1] == "avalanche-SplitMNIST class 2"
