"""W&B sweeps drive ``cfl run``: a simulated ``wandb agent`` (its environment and parameter file, written by
wandb's own agent helpers), W&B offline; the run trains with the sweep's values and W&B records them."""

import json
from pathlib import Path

import pytest
import tomllib
import wandb
import yaml
from wandb.sdk.launch.sweeps import utils as sweep_utils
from wandb.sdk.lib import config_util

from cfl.app.cli import main
from cfl.report.wandb_sweep import read_sweep_params

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "wandb-sweep.yaml"
TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 1, "batch_size": 32, "lr": 0.05, "seed": 0, "eval_every": 1, "threads": 1,
        "checkpoint_every": 0, "wandb": {"mode": "offline"}}


def agent_command(args: dict, monkeypatch, tmp_path, sweep_id="swp1", run_id="run7"):
    """What ``wandb agent`` does before starting the example's command: the environment, the parameter
    file (wandb's own writer), and the command line with its macros filled in (wandb's own helpers)."""
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR"):  # artifacts are staged under WANDB_DATA_DIR
        monkeypatch.setenv(var, str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SWEEP_ID", sweep_id)
    monkeypatch.setenv("WANDB_RUN_ID", run_id)
    param_path = tmp_path / "wandb-dir" / "wandb" / f"sweep-{sweep_id}" / f"config-{run_id}.yaml"
    config_util.save_config_file_from_dict(str(param_path), args)
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(param_path))
    spec = yaml.safe_load(EXAMPLE.read_text())
    macros = sweep_utils.create_sweep_command_args({"args": args})
    macros["program"] = [spec["program"]]
    command = []
    for chunk in sweep_utils.create_sweep_command(list(spec["command"])):
        command += macros.get(chunk[2:-1], []) if chunk.startswith("${") else [chunk]
    return command


def cfl_argv(command, tmp_path):
    """The agent's command as ``cfl`` arguments, on the tiny config, W&B offline (no network in tests)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[:2] == ["cfl", "run"] and scripts["cfl"] == "cfl.app.cli:main"
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    return [str(tiny) if c.endswith(".yaml") else c.replace("wandb.mode=online", "wandb.mode=offline")
            for c in command[1:]]


@pytest.fixture
def wandb_configs(monkeypatch):
    """The real ``wandb.init`` in a fresh W&B session (as in the agent's new process); records each run's
    config as W&B holds it."""
    seen, real = [], wandb.init

    def init(**kwargs):
        run = real(**kwargs)
        seen.append({k: v for k, v in dict(run.config).items() if k != "_wandb"})
        return run

    wandb.teardown()
    monkeypatch.setattr(wandb, "init", init)
    yield seen
    wandb.teardown()


def test_a_sweep_run_trains_with_the_sweeps_values_and_records_them(monkeypatch, tmp_path, wandb_configs, recwarn):
    args = {"lr": {"value": 0.5}, "seed": {"value": 7}, "method.name": {"value": "fedprox"}}
    argv = cfl_argv(agent_command(args, monkeypatch, tmp_path), tmp_path)
    assert main(argv) == 0
    out = tmp_path / "runs" / "sweep-swp1" / "split-digits-fedprox-iid-s7-run7"
    used = yaml.safe_load((out / "config.yaml").read_text())
    assert (used["lr"], used["seed"], used["method"]["name"]) == (0.5, 7, "fedprox")
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 7 and results["method"] == "fedprox" and results["wandb_run_id"] == "run7"
    assert wandb_configs == [{**used, "method.name": "fedprox"}]
    assert not [w for w in recwarn if "W&B" in str(w.message)]  # the real client logged everything, artifact too
    assert list((out / "wandb").glob("offline-run-*-run7/run-run7.wandb"))


def test_wandb_records_the_value_used_not_the_agents_text(monkeypatch, tmp_path, wandb_configs):
    """PyYAML reads ``1e-1`` in a sweep file as text; cfl reads it as 0.1, and W&B must record 0.1."""
    argv = cfl_argv(agent_command({"lr": {"value": "1e-1"}}, monkeypatch, tmp_path), tmp_path)
    assert main(argv) == 0
    assert wandb_configs[0]["lr"] == 0.1 and isinstance(wandb_configs[0]["lr"], float)


@pytest.mark.parametrize(("args", "named"), [
    ({"momentum_typo": {"value": 0.9}}, "unknown config key 'momentum_typo'"),
    ({"lr": {"value": -1}}, "'lr' must be > 0"),
    ({"method.mu": {"value": 0.1}}, "method.mu"),
    ({"seed": {"value": "seven"}}, "'seed' must be an integer"),
])
def test_a_bad_sweep_parameter_exits_2_naming_it_before_any_file(monkeypatch, tmp_path, capsys, args, named):
    argv = cfl_argv(agent_command(args, monkeypatch, tmp_path), tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "W&B sweep parameters" in err
    assert not (tmp_path / "runs").exists()


def test_a_key_from_both_the_sweep_and_set_is_refused(monkeypatch, tmp_path, capsys):
    argv = cfl_argv(agent_command({"method": {"value": {"name": "fedprox"}}}, monkeypatch, tmp_path), tmp_path)
    assert main([*argv, "--set", "method.name=fedavg"]) == 2
    assert "--set method.name: also set by the W&B sweep" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--resume", "some-run"], ["sweep", "some-sweep.yaml"]])
def test_commands_that_cannot_take_sweep_parameters_refuse_them(monkeypatch, tmp_path, capsys, argv):
    agent_command({"lr": {"value": 0.5}}, monkeypatch, tmp_path)
    assert main(argv) == 2
    assert "cannot take the sweep's parameters" in capsys.readouterr().err


# ---- a config is code: a sweep's stream.benchmark is admitted only from trusted modules ----
@pytest.mark.parametrize(("benchmark", "named"), [
    ("subprocess.getoutput", "'stream.benchmark: subprocess.getoutput' comes from the W&B sweep parameter file"),
    ("tests.avalanche_benchmarks.digits", "may name only callables of avalanche.benchmarks"),
    ("avalanche.benchmarks.classic.cmnist.torch.hub.load", "is defined in module torch.hub, not in the module"),
    ("avalanche.benchmarks.classic.__builtins__.eval", "a config is code"),
])
def test_a_sweep_cannot_name_code_to_run(monkeypatch, tmp_path, capsys, benchmark, named):
    marker = tmp_path / "PWNED"
    stream = {"name": "avalanche", "benchmark": benchmark, "args": {"cmd": f"touch '{marker}'"}}
    argv = cfl_argv(agent_command({"stream": {"value": stream}}, monkeypatch, tmp_path), tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert not marker.exists(), err  # the shell command never ran
    for word in [named, "--trust-callables or CFL_TRUST_CALLABLES=1", "W&B sweep parameters"]:
        assert word in err, err
    assert not (tmp_path / "runs").exists()


def _sweep_config(monkeypatch, tmp_path, stream_params: dict, file_stream: dict | None = None) -> Path:
    """Under a simulated agent whose parameters set ``stream.*``: the config file's path."""
    params = tmp_path / "config-run7.yaml"
    config_util.save_config_file_from_dict(str(params), {f"stream.{k}": {"value": v} for k, v in stream_params.items()})
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(params))
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "stream": file_stream or TINY["stream"]}))
    return config


DIGITS = "tests.avalanche_benchmarks.digits"


@pytest.mark.parametrize("how", ["--trust-callables", "CFL_TRUST_CALLABLES=1", "a --plugin file", "the file's own"])
def test_a_sweep_benchmark_is_admitted_when_trusted(monkeypatch, tmp_path, how):
    import cfl.plugin_files
    from cfl.report.wandb_sweep import load_with_sweep

    benchmark = DIGITS
    stream, file_stream = {"name": "avalanche", "benchmark": DIGITS, "args": {"n_experiences": 5}}, None
    if how == "CFL_TRUST_CALLABLES=1":
        monkeypatch.setenv("CFL_TRUST_CALLABLES", "1")
    if how == "a --plugin file":
        plugin = tmp_path / "bench.py"
        plugin.write_text(f"from {DIGITS.rsplit('.', 1)[0]} import digits as upstream\n\n\n"
                          "def digits(**kw):\n    return upstream(**kw)\n")
        monkeypatch.setattr(cfl.plugin_files, "LOADED", {})
        cfl.plugin_files.load_plugins([str(plugin)])
        stream["benchmark"] = benchmark = "cfl_plugin_bench.digits"
    if how == "the file's own":
        stream, file_stream = {"args": {"n_experiences": 5, "task_labels": False}}, {"name": "avalanche",
                                                                                     "benchmark": DIGITS}
    cfg, _ = load_with_sweep(_sweep_config(monkeypatch, tmp_path, stream, file_stream), [],
                             trust_callables=how == "--trust-callables")
    assert cfg.stream.benchmark == benchmark and cfg.stream.args["n_experiences"] == 5


@pytest.mark.parametrize(("sweep_id", "run_id", "named"), [
    ("swp1", "a/../../../outside", "$WANDB_RUN_ID 'a/../../../outside' is not a W&B id"),
    ("../../outside", "run7", "$WANDB_SWEEP_ID '../../outside' is not a W&B id"),
    ("swp1", "..", "$WANDB_RUN_ID '..' is not a W&B id"),
    ("swp1", "run\\7", "$WANDB_RUN_ID 'run\\\\7'"),
])
def test_unsafe_sweep_or_run_ids_are_refused_before_any_path(monkeypatch, tmp_path, capsys, sweep_id, run_id, named):
    monkeypatch.chdir(tmp_path)
    config = _sweep_config(monkeypatch, tmp_path, {"num_tasks": 1})
    monkeypatch.setenv("WANDB_SWEEP_ID", sweep_id)
    monkeypatch.setenv("WANDB_RUN_ID", run_id)
    assert main(["run", str(config), "--quiet"]) == 2
    assert named in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config-run7.yaml", "tiny.yaml"]


def test_the_parameter_file_nested_values_become_dotted_keys(tmp_path):
    path = tmp_path / "config-r.yaml"
    config_util.save_config_file_from_dict(str(path), {"method": {"value": {"name": "fedprox", "mu": 0.01}},
                                                       "seed": {"value": 7}})
    assert read_sweep_params(path) == {"method.name": "fedprox", "method.mu": 0.01, "seed": 7}


def test_a_malformed_parameter_file_is_a_config_error(monkeypatch, tmp_path, capsys):
    path = tmp_path / "config-r.yaml"
    path.write_text("wandb_version: 1\nlr: 0.5\n")
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(path))
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(tiny), "--out", str(tmp_path / "run")]) == 2
    assert "parameter 'lr' must be a mapping with a 'value'" in capsys.readouterr().err


def test_the_docs_show_the_example_sweep():
    page = (ROOT / "docs" / "wandb.md").read_text()
    block = page.split("`configs/wandb-sweep.yaml`:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(block) == yaml.safe_load(EXAMPLE.read_text())


def test_the_example_compares_methods_that_differ_from_fedavg():
    """Each method of the example differs from FedAvg at the quickstart's settings (FedProx at its default mu, 0.01,
    reproduces FedAvg's numbers there; see the README), and every combination is a valid config."""
    from cfl.validation import load_config

    spec = yaml.safe_load(EXAMPLE.read_text())
    methods = spec["parameters"]["method.name"]["values"]
    assert methods[0] == "fedavg" and len(methods) > 1
    for name in methods:
        cfg = load_config(ROOT / "configs" / "quickstart.yaml", [f"method.name={name}"])
        assert name != "fedprox" or cfg.method["mu"] >= 0.1
    assert spec["metric"]["name"] == "acc" and spec["early_terminate"]["type"] == "hyperband"
