"""`cfl sweep`: grid expansion, validation before work, skipping complete runs."""

import json

import pytest
import yaml

from cfl.app.sweep import is_complete, load_sweep, load_sweeps, run_local, run_parallel
from cfl.config.schema import ConfigError
from tests.helpers import metrics_values

BASE = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 1, "batch_size": 32, "wandb": {"mode": "disabled"}}


def _write(tmp_path, grid, **extra):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "grid": grid, "out": str(tmp_path / "runs"), **extra}))
    return path


def test_grid_is_expanded_with_readable_names(tmp_path):
    runs = load_sweep(_write(tmp_path, {"method.name": ["fedavg", "fedprox"], "seed": [0, 1, 2]},
                             set={"lr": 0.2}))
    assert len(runs) == 6
    assert runs[0].name == "method=fedavg__seed=0" and runs[-1].name == "method=fedprox__seed=2"
    assert all(r.config.lr == 0.2 for r in runs)
    assert {r.config.method["name"] for r in runs} == {"fedavg", "fedprox"}


def test_wandb_groups_of_sweep_runs_name_what_the_grid_changed(tmp_path, monkeypatch):
    import cfl.app.single_run
    from cfl.report.wandb_names import default_group

    sources = []
    def execute(cfg, _out, source=None, **_):
        sources.append((cfg, source))
        return {"acc": 0.0, "fgt": 0.0, "wall_seconds": 0.0}

    monkeypatch.setattr(cfl.app.single_run, "execute", execute)
    run_local(load_sweep(_write(tmp_path, {"lr": [0.05, 0.5], "seed": [0, 1]}, set={"momentum": 0.5})))
    groups = [default_group(cfg, source.base) for cfg, source in sources]
    assert [g.split("#")[0] for g in groups] == ["split-digits/iid/fedavg/lr=0.05"] * 2 + [
        "split-digits/iid/fedavg/lr=0.5"] * 2  # the base's own and `set` keys are not named; seeds share a group
    assert groups[0] == groups[1] != groups[2] == groups[3]


def test_a_bad_combination_is_refused_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match="clients_per_round=9"):
        load_sweep(_write(tmp_path, {"clients_per_round": [2, 9]}))
    with pytest.raises(ConfigError, match="unknown sweep key"):
        load_sweep(_write(tmp_path, {"seed": [0]}, grdi={}))


def test_complete_runs_are_skipped(tmp_path, capsys):
    runs = load_sweep(_write(tmp_path, {"seed": [0, 1]}))
    finished, failed = run_local(runs)
    assert len(finished) == 2 and failed == [] and all(is_complete(r.out) for r in runs)
    before = (runs[0].out / "results.json").read_text()
    assert run_local(runs) == ([], [])
    assert "already complete, skipped" in capsys.readouterr().out
    assert (runs[0].out / "results.json").read_text() == before


def test_variants_set_several_keys_together(tmp_path):
    runs = load_sweep(_write(tmp_path, {"variant": [{"label": "gma", "aggregator.name": "gma"},
                                                    {"label": "prox", "method": {"name": "fedprox", "mu": 0.1}}],
                                        "seed": [0]}))
    assert [r.name for r in runs] == ["seed=0__gma", "seed=0__prox"]  # the test writes keys sorted
    assert runs[0].config.aggregator.name == "gma" and runs[1].config.method == {"name": "fedprox", "mu": 0.1}
    with pytest.raises(ConfigError, match="label"):
        load_sweep(_write(tmp_path, {"variant": [{"aggregator.name": "gma"}]}))


def test_parallel_jobs_give_the_same_results_as_one_after_another(tmp_path, capsys):
    serial = load_sweep(_write(tmp_path, {"seed": [0, 1]}), out=tmp_path / "serial")
    parallel = load_sweep(_write(tmp_path, {"seed": [0, 1]}), out=tmp_path / "parallel")
    run_local(serial)
    results, failed = run_parallel(parallel, jobs=2)
    assert failed == [] and len(results) == 2
    for a, b in zip(serial, parallel, strict=True):
        matrix = [json.loads((r.out / "results.json").read_text())["acc_matrix"] for r in (a, b)]
        assert matrix[0] == matrix[1]
    assert run_parallel(parallel, jobs=2) == ([], [])
    assert "already complete, skipped" in capsys.readouterr().out


def test_several_sweep_files_run_together_but_never_share_a_directory(tmp_path):
    path = _write(tmp_path, {"seed": [0, 1]})
    with pytest.raises(ConfigError, match="same directory"):
        load_sweeps([path, path])
    with pytest.raises(ConfigError, match="--out"):
        load_sweeps([path, path], out=tmp_path / "x")
    assert len(load_sweeps([path])) == 2


@pytest.mark.parametrize("argv, words", [(["--jobs", "0"], "--jobs must be at least 1"),
                                         (["--jobs", "2", "--backend", "ray"], "--num-cpus")])
def test_bad_jobs_are_refused_before_any_run(tmp_path, capsys, argv, words):
    from cfl.app.cli import main

    path = _write(tmp_path, {"seed": [0]})
    assert main(["sweep", str(path), *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mode", [["--jobs", "1"], ["--jobs", "2"], ["--backend", "ray", "--num-cpus", "2"]],
                         ids=["sequential", "jobs", "ray"])
def test_a_diverging_run_fails_alone_and_the_sweep_exits_1(tmp_path, capsys, mode):
    from cfl.app.cli import main

    if "ray" in mode:
        pytest.importorskip("ray", reason="Ray is not installed (the extra ray)")
    path = _write(tmp_path, {"variant": [{"label": "diverges", "lr": 1.0e30}, {"label": "fine", "lr": 0.05}]})
    assert main(["sweep", str(path), *mode]) == 1
    out, err = capsys.readouterr()
    assert "diverges: FAILED: non-finite loss or update" in out and "(exit code 3)" in out
    assert is_complete(tmp_path / "runs" / "fine") and not is_complete(tmp_path / "runs" / "diverges")
    assert "| fine |" in out  # the report of the runs that finished, named by its variant label
    assert "1 run(s) failed: diverges" in err


def test_a_sweep_whose_runs_all_fail_names_them_and_exits_1(tmp_path, capsys):
    from cfl.app.cli import main

    path = _write(tmp_path, {"variant": [{"label": "diverges", "lr": 1.0e30}]})
    assert main(["sweep", str(path)]) == 1
    err = capsys.readouterr().err
    assert "1 run(s) failed: diverges" in err and "no results.json" not in err


def test_an_interrupted_sweep_resumes_the_cut_off_run_and_skips_finished_ones(tmp_path, monkeypatch, capsys):
    """SIGINT in the second run's round 3 (of 4): started again, the sweep skips the first run, trains only
    round 4 of the second, from its checkpoint, and ends as an uninterrupted sweep; every printed resume
    command names the --plugin file."""
    import dataclasses
    import signal

    from cfl.app.cli import main
    from cfl.engine.rounds.runner import Runner

    plugin = tmp_path / "noop.py"
    plugin.write_text("NOTHING = None  # a plugin file the runs do not need; the commands must still name it\n")
    path = _write(tmp_path, {"seed": [0, 1]}, set={"checkpoint_every": 1, "threads": 1, "rounds_per_task": 2})
    run_local(load_sweep(path, out=tmp_path / "reference"))
    real, trained = Runner.run_round, []

    def run_round(self, task, rnd):
        record = real(self, task, rnd)
        trained.append((self.cfg.seed, record["round"]))
        if trained[-1] == (1, 3) and len(trained) == 7:  # the first time only
            signal.raise_signal(signal.SIGINT)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)
    before = signal.getsignal(signal.SIGINT)
    assert main(["sweep", str(path), "--plugin", str(plugin)]) == 130
    err = capsys.readouterr().err
    cut = tmp_path / "runs" / "seed=1"
    assert f"Resume with: cfl run --resume {cut} --plugin {plugin}" in err
    assert f"resume the sweep with the same command: cfl sweep {path} --plugin {plugin}" in err
    assert signal.getsignal(signal.SIGINT) is before
    trained.clear()
    assert main(["sweep", str(path), "--plugin", str(plugin)]) == 0
    out = capsys.readouterr().out
    assert "seed=0: already complete, skipped" in out and "seed=1: resuming from its checkpoint.pt" in out
    assert trained == [(1, 4)]
    for name in ("seed=0", "seed=1"):
        metrics = [metrics_values(d / name / "metrics.jsonl") for d in (tmp_path / "runs", tmp_path / "reference")]
        assert metrics[0] == metrics[1]
        matrices = [json.loads((d / name / "results.json").read_text())["acc_matrix"]
                    for d in (tmp_path / "runs", tmp_path / "reference")]
        assert matrices[0] == matrices[1]
    from cfl.app.sweep import resumable

    other = dataclasses.replace(load_sweep(path)[1].config, lr=0.5)
    (cut / "results.json").unlink()  # as if cut off again, but the sweep file now says lr 0.5
    resume, note = resumable(other, cut)
    assert not resume and note.endswith("(lr: 0.01 in the checkpoint, 0.5 now); starting it again from round 0")


def test_sigint_in_a_runs_last_round_stops_the_sweep_with_that_run_complete(tmp_path, monkeypatch, capsys):
    """ A signal in the last round lets the run finish its outputs, then the sweep stops
    (it used to go on with every remaining run)."""
    import signal

    from cfl.app.cli import main
    from cfl.engine.rounds.runner import Runner

    path = _write(tmp_path, {"seed": [0, 1, 2]}, set={"threads": 1})
    real, trained = Runner.run_round, []

    def run_round(self, task, rnd):
        record = real(self, task, rnd)
        trained.append((self.cfg.seed, record["round"]))
        if trained[-1] == (0, 2):  # the last round of the first run
            signal.raise_signal(signal.SIGINT)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)
    assert main(["sweep", str(path)]) == 130
    err = capsys.readouterr().err
    assert "stopped by SIGINT after run seed=0 finished (its outputs are complete); 2 run(s) not started" in err
    assert "resume the sweep with the same command" in err
    assert trained == [(0, 1), (0, 2)] and is_complete(tmp_path / "runs" / "seed=0")
    assert not (tmp_path / "runs" / "seed=1").exists()
    trained.clear()
    assert main(["sweep", str(path)]) == 0
    assert [seed for seed, _ in trained] == [1, 1, 2, 2]
