"""End to end through the `cfl` command: outputs, their agreement with the definitions, refusals."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from cfl.metrics.matrix import average_accuracy, forgetting
from cfl.report.plots import PLOT_FILES

TINY = {"stream": {"name": "split-digits", "num_tasks": 3}, "num_clients": 6, "clients_per_round": 3,
        "rounds_per_task": 3, "batch_size": 16, "lr": 0.05, "eval_every": 1, "wandb": {"mode": "offline"},
        "target_accuracies": [50, 99.9]}


def cfl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cfl", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = root / "run"
    proc = cfl("run", str(config), "--out", str(out), "--set", "seed=1")
    assert proc.returncode == 0, proc.stderr
    assert "ACC" in proc.stdout and str(out) in proc.stdout
    return out


def test_every_output_is_written(run_dir):
    for name in ("results.json", "metrics.jsonl", "config.yaml", *PLOT_FILES):
        assert (run_dir / name).stat().st_size > 0, name
    assert (run_dir / "wandb").is_dir()  # offline W&B run


def test_results_agree_with_definitions(run_dir):
    r = json.loads((run_dir / "results.json").read_text())
    for key in ("stream", "method", "partition", "seed", "num_tasks", "acc_matrix", "acc", "fgt", "bwt", "rounds",
                "wall_seconds", "upload_bytes", "download_bytes", "method_stats", "config"):
        assert key in r, key
    m = r["acc_matrix"]
    assert r["seed"] == 1 and r["num_tasks"] == 3 and r["rounds"] == 9
    assert m[0][1] is None and m[0][2] is None and m[1][2] is None
    assert r["acc"] == pytest.approx(average_accuracy(m))
    assert r["fgt"] == pytest.approx(forgetting(m)) and r["bwt"] == pytest.approx(-r["fgt"])
    # every round: 3 clients download and upload the model once
    assert r["upload_bytes"] == r["download_bytes"] == 9 * 3 * r["model_bytes"]
    assert set(r["rounds_to_target"]) == {"0", "1", "2"}
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["seed"] == 1 and saved["method"] == {"name": "fedavg"} and saved == r["config"]


def test_metrics_lines_match_matrix(run_dir):
    every = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in every if x["kind"] == "evaluation"]
    assert [x["round"] for x in every if x["kind"] == "round"] == list(range(1, 10))  # one line per round
    assert [x["round"] for x in lines] == list(range(1, 10))
    assert [x["task"] for x in lines] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    matrix = json.loads((run_dir / "results.json").read_text())["acc_matrix"]
    finals = [x for x in lines if x["final"]]
    for i, rec in enumerate(finals):
        assert [rec["acc"][str(j)] for j in range(i + 1)] == matrix[i][: i + 1]


def test_report_table_and_list(run_dir):
    proc = cfl("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "| split-digits (task-IL) | iid | fedavg | 1 |" in proc.stdout  # the stream names its scenario
    listing = cfl("list").stdout
    for word in ("streams:", "split-digits", "models:", "partitioners:", "dirichlet", "methods:", "fedavg"):
        assert word in listing


def test_existing_run_dir_is_not_overwritten(run_dir):
    before = (run_dir / "results.json").read_text()
    proc = cfl("run", str(run_dir / "config.yaml"), "--out", str(run_dir))
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert (run_dir / "results.json").read_text() == before


def test_config_errors_exit_2_before_work(tmp_path):
    proc = cfl("run", "missing.yaml", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(TINY))
    proc = cfl("run", str(config), "--set", "clients_per_round=60", "--out", str(tmp_path / "y"))
    assert proc.returncode == 2 and "clients_per_round" in proc.stderr
    assert not (tmp_path / "y").exists()


def test_the_model_used_is_recorded(run_dir):
    """`model: auto` is resolved at validation: config.yaml and results.json name the model that ran."""
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["name"] == "digits-mlp"
    assert json.loads((run_dir / "results.json").read_text())["config"]["model"]["name"] == "digits-mlp"


def test_a_run_saved_with_model_auto_still_resumes(run_dir, tmp_path):
    """Runs from before `auto` was resolved at validation hold `model: {name: auto}` in config.yaml and in the
    checkpoint; they resume (here from the final checkpoint) and record the model that ran."""
    from cfl.app.cli import main
    from cfl.engine.stores import checkpoint
    old = tmp_path / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns("wandb"))
    (old / "results.json").unlink()
    config = yaml.safe_load((old / "config.yaml").read_text())
    config["model"]["name"] = "auto"
    (old / "config.yaml").write_text(yaml.safe_dump(config))
    payload = checkpoint.load(old)
    payload["config"]["model"]["name"] = "auto"
    checkpoint.save(old, payload)
    assert main(["run", "--resume", str(old), "--set", "wandb.mode=disabled", "--quiet"]) == 0
    assert json.loads((old / "results.json").read_text())["config"]["model"]["name"] == "digits-mlp"


@pytest.mark.parametrize(("sweep", "words"), [
    ("base: {base}\ngrid:\n  method: [{{name: fot, gpse_clients: 4}}, {{name: fot, gpse_clients: 1000}}]\n",
     ["combination method=name_fot_gpse_clients_1000", "'method.gpse_clients' (1000)"]),
    ("base: {base}\ngrid:\n  model.name: [auto, alexnet]\n", ["combination model=alexnet", "does not fit"]),
    ("base: {base}\ngrid:\n  seed: [0, 1]\n  seed: [2]\n", ["sweep.yaml", "key 'seed' is given twice"]),
])
def test_sweep_validates_every_combination_before_running_any(sweep, words, tmp_path, monkeypatch, capsys):
    import cfl.app.single_run
    from cfl.app.cli import main

    refused_first = lambda *_, **__: pytest.fail("a run started before the refusal")  # noqa: E731
    monkeypatch.setattr(cfl.app.single_run, "load_stream", refused_first)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**TINY, "wandb": {"mode": "disabled"}}))
    (tmp_path / "sweep.yaml").write_text(sweep.format(base=tmp_path / "base.yaml"))
    assert main(["sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err
    assert not (tmp_path / "runs").exists()


def test_binary_sweep_file_exits_2(tmp_path, capsys):
    from cfl.app.cli import main

    (tmp_path / "sweep.yaml").write_bytes(bytes(range(256)))
    assert main(["sweep", str(tmp_path / "sweep.yaml")]) == 2
    assert "sweep.yaml' is not UTF-8" in capsys.readouterr().err


def test_list_shows_every_name_a_config_can_take_from_the_registries(capsys):
    from cfl.app.cli import main
    from cfl.data.avalanche_route import ROUTE
    from cfl.data.partition import PARTITIONERS
    from cfl.data.stream_registry import STREAMS
    from cfl.methods import METHODS
    from cfl.models import MODELS
    from cfl.ops.aggregate import AGGREGATORS
    from cfl.ops.losses import LOSSES
    from cfl.schedules import SCHEDULES
    from cfl.validation import from_dict

    assert main(["list"]) == 0
    sections: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith(" "):
            sections[line.rstrip(":")] = []
        else:
            sections[list(sections)[-1]].append(line.split()[0])
    registries = {"streams": [*STREAMS, ROUTE], "models": MODELS, "partitioners": PARTITIONERS, "methods": METHODS,
                  "aggregators": AGGREGATORS, "losses": LOSSES, "schedules": SCHEDULES}
    assert sections == {title: list(names) for title, names in registries.items()}
    for name in AGGREGATORS:  # what a config accepts
        assert from_dict({"aggregator": {"name": name}}).aggregator.name == name
    for name in LOSSES:
        assert from_dict({"loss": name}).loss == name


def test_report_of_real_runs_splits_by_lr_not_by_threads_or_wandb(run_dir, tmp_path):
    """A real run's results.json, copied with only lr changed (one copy) or only result-neutral keys and
    the seed changed (another): two rows, the neutral copy averaged with the original."""
    def copy(name, seed, **keys):
        out = tmp_path / name
        shutil.copytree(run_dir, out)
        results = json.loads((out / "results.json").read_text())
        results["seed"] = results["config"]["seed"] = seed
        results["config"].update(keys)
        (out / "results.json").write_text(json.dumps(results))
    copy("lr", 1, lr=0.5)
    copy("neutral", 2, threads=3, checkpoint_every=0, wandb={"mode": "disabled"})
    proc = cfl("report", str(run_dir), str(tmp_path), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(",")[2:4] for line in proc.stdout.splitlines()[1:]]
    assert rows == [["fedavg lr=0.05", "2"], ["fedavg lr=0.5", "1"]]
