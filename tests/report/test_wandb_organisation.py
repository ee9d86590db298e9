"""How runs are organised in W&B: group (seeds of one config together, nothing else), name, tags, job type,
metrics against the global round, and the output files as an artifact."""

import json
import os

import pytest
import wandb

from cfl.app.cli import main
from cfl.report.plots import PLOT_FILES
from cfl.report.wandb_log import ARTIFACT_FILES
from cfl.report.wandb_names import GROUP_MAX, config_hash, default_group, default_name, default_tags
from tests.conftest import tiny_config
from tests.report.test_wandb_faults import FakeRun, write_tiny

PLOTS = set(PLOT_FILES)


def test_seeds_of_one_config_share_a_group_and_nothing_else_does():
    base = tiny_config()
    group = default_group(base, base)
    assert default_group(tiny_config(seed=3), base) == group
    neutral = tiny_config(threads=1, checkpoint_every=0, wandb={"mode": "offline", "project": "x", "tags": ["a"]},
                          data_root="/elsewhere", on_nonfinite="skip_client")
    assert default_group(neutral, base) == group
    fmnist = tiny_config(stream={"name": "permuted-fmnist", "num_tasks": 2})  # a stream that reads stream.download
    downloading = tiny_config(stream={"name": "permuted-fmnist", "num_tasks": 2, "download": True})
    assert default_group(downloading, fmnist) == default_group(fmnist, fmnist)
    assert default_group(tiny_config(lr=0.5), base) != group
    assert default_group(tiny_config(lr=0.5), None) != default_group(base, None)  # the hash tells them apart


def test_the_group_names_what_differs_from_the_config_file():
    base = tiny_config()
    cfg = tiny_config(lr=0.5, seed=4, method={"name": "fedprox", "mu": 0.5})
    assert default_group(cfg, base) == f"split-digits/iid/fedprox/lr=0.5,mu=0.5#{config_hash(cfg)}"
    assert default_group(base, base) == f"split-digits/iid/fedavg#{config_hash(base)}"
    assert len(config_hash(cfg)) == 6


@pytest.mark.parametrize(("changes", "named"), [
    ({"method": {"name": "ewc"}}, ""),  # EWC's own defaults (lam, gamma, fisher, mode) are not differences
    ({"method": {"name": "ewc", "lam": 5.0}}, "/lam=5.0"),
    ({"method": {"name": "fedprox", "mu": 0.01}}, ""),  # FedProx's default mu
    ({"partition": {"name": "dirichlet", "alpha": 0.1}, "stream": {"name": "split-digits", "num_tasks": 2,
                                                                    "scenario": "class"}}, "/alpha=0.1,scenario=class"),
    ({"optimizer": {"name": "adam", "eps": 1e-6}}, "/eps=1e-06,optimizer.name=adam"),  # `name` is in many sections
    ({"method": {"name": "fot", "eps": 0.9}}, "/method.eps=0.9"),  # FOT's eps beside optimizer.eps
])
def test_a_group_names_only_the_settings_that_differ_and_shortly(changes, named):
    base = tiny_config()
    cfg = tiny_config(**changes)
    head = f"split-digits/{cfg.partition.name}/{cfg.method_label}"
    assert default_group(cfg, base) == f"{head}{named}#{config_hash(cfg)}"


def test_a_method_switched_back_to_fedavg_names_none_of_the_base_methods_parameters():
    base = tiny_config(method={"name": "ewc", "lam": 5.0})
    cfg = tiny_config()
    assert default_group(cfg, base) == f"split-digits/iid/fedavg#{config_hash(cfg)}"


def test_runs_of_one_sweep_that_differ_never_share_a_name():
    base = tiny_config()
    names = {default_name(tiny_config(lr=lr, method=m), base)
             for lr in (0.05, 0.1, 0.5) for m in ({"name": "fedavg"}, {"name": "fedprox", "mu": 1.0})}
    assert len(names) == 6 and "split-digits-fedprox-iid-lr=0.1,mu=1.0-s0" in names
    assert "split-digits-fedavg-iid-s0" in names  # the base's own values: the name of a plain `cfl run`
    assert default_name(tiny_config(lr=0.5), None) != default_name(tiny_config(lr=0.1), None)  # the hash, then


def test_a_long_group_is_cut_to_what_wandb_accepts_keeping_the_hash():
    base = tiny_config()
    cfg = tiny_config(wandb={"mode": "disabled", "tags": []}, **{k: 0.5 for k in ("lr", "momentum")},
                      method={"name": "fedprox", "mu": 0.123456789012345}, num_clients=123456, clients_per_round=6,
                      rounds_per_task=98765, batch_size=4321, local_epochs=77, weight_decay=0.000123456)
    group = default_group(cfg, base)
    assert len(group) == GROUP_MAX and group.endswith(f"~#{config_hash(cfg)}")


def test_name_has_the_seed_and_tags_name_the_parts():
    cfg = tiny_config(seed=3, aggregator={"name": "gma"}, wandb={"mode": "disabled", "tags": ["paper", "iid"]})
    assert default_name(cfg, tiny_config()) == "split-digits-fedavg+gma-iid-s3"
    assert default_tags(cfg) == ["split-digits", "iid", "fedavg", "gma", "paper"]


class RecordingRun(FakeRun):
    """A fake run that records ``define_metric`` and logged artifacts."""

    def __init__(self):
        super().__init__()
        self.metrics, self.artifacts = [], []

    def define_metric(self, name, step_metric=None):
        self.metrics.append((name, step_metric))

    def log_artifact(self, artifact):
        self.artifacts.append(sorted(artifact.manifest.entries))


def run_with(tmp_path, monkeypatch, *sets):
    run, calls = RecordingRun(), []

    def init(**kwargs):
        calls.append(kwargs)
        return run.started(kwargs)

    monkeypatch.setattr(wandb, "init", init)
    argv = ["run", str(write_tiny(tmp_path)), "--out", str(tmp_path / "run"), "--quiet",
            *[a for s in sets for a in ("--set", s)]]
    assert main(argv) == 0
    return run, calls[0]


def test_a_run_is_grouped_named_and_plotted_against_the_global_round(tmp_path, monkeypatch):
    run, kwargs = run_with(tmp_path, monkeypatch, "lr=0.1", "seed=5", "wandb.tags=[mine]")
    assert kwargs["group"].startswith("split-digits/iid/fedavg/lr=0.1#")  # seed and wandb.* are not named
    assert (kwargs["name"], kwargs["job_type"]) == ("split-digits-fedavg-iid-lr=0.1-s5", "train")
    assert kwargs["tags"] == ["split-digits", "iid", "fedavg", "mine"]
    assert run.metrics == [("round", None), ("*", "round")]
    steps = [(step, data["round"]) for step, data in run.logged if step is not None]
    assert steps and all(step == rnd for step, rnd in steps) and max(s for s, _ in steps) == 4


@pytest.mark.parametrize(("sets", "files"), [
    ((), {"results.json", "metrics.jsonl", "config.yaml", *PLOTS}),
    (("wandb.log_checkpoint=true",), {"results.json", "metrics.jsonl", "config.yaml", "checkpoint.pt", *PLOTS}),
    (("wandb.log_artifacts=false",), None),
])
def test_the_outputs_are_logged_as_an_artifact(tmp_path, monkeypatch, sets, files):
    run, _ = run_with(tmp_path, monkeypatch, *sets)
    assert run.artifacts == ([sorted(files)] if files else [])


def test_a_set_group_name_and_job_type_are_used_as_given(tmp_path, monkeypatch):
    _, kwargs = run_with(tmp_path, monkeypatch, "wandb.group=mine", "wandb.name=r1", "wandb.job_type=eval")
    assert (kwargs["group"], kwargs["name"], kwargs["job_type"]) == ("mine", "r1", "eval")


def test_a_config_that_wandb_records_differently_is_warned(tmp_path, monkeypatch):
    run = RecordingRun()

    def init(**kwargs):
        run.started(kwargs)
        run.config = {**kwargs["config"], "lr": "1e-1"}  # as when W&B merges a sweep's raw text
        return run

    monkeypatch.setattr(wandb, "init", init)
    with pytest.warns(UserWarning, match=r"W&B recorded config keys \['lr'\] .*lr=0.05"):
        assert main(["run", str(write_tiny(tmp_path)), "--out", str(tmp_path / "run"), "--quiet"]) == 0


def summary_of(run):
    """W&B's summary: each key's last logged value, then the values set in ``run.summary``."""
    summary = {}
    for _, data in run.logged:
        summary.update(data)
    return {**summary, **run.summary}


def test_the_summary_holds_the_final_values_and_acc_has_a_history(tmp_path, monkeypatch):
    run, _ = run_with(tmp_path, monkeypatch)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    summary = summary_of(run)
    assert summary["mean_acc"] == summary["acc/mean_seen"] == summary["acc"] == pytest.approx(results["acc"])
    evaluations = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rounds = [e["round"] for e in evaluations if e["kind"] == "evaluation"]
    assert [step for step, data in run.logged if "acc" in data] == rounds == [1, 2, 3, 4]  # eval_every: 1


def test_offline_artifacts_are_staged_inside_the_run_directory(tmp_path, monkeypatch):
    """A real offline W&B run: nothing is staged in the user's data directory (~/.local/share/wandb)."""
    monkeypatch.delenv("WANDB_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "user-data"))
    wandb.teardown()
    try:
        assert main(["run", str(write_tiny(tmp_path)), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    finally:
        wandb.teardown()
    assert not list((tmp_path / "user-data").rglob("*.*")) and not (tmp_path / "user-data" / "wandb").exists()
    staged = list((tmp_path / "run" / "wandb" / "artifacts" / "staging").iterdir())
    assert len(staged) >= len(ARTIFACT_FILES) + len(PLOTS)  # the output files, the plots, the table
    assert "WANDB_DATA_DIR" not in os.environ  # set only while W&B stages them
