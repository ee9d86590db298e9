"""The Ray backend (cfl/engine/local/ray_backend.py, cfl/app/sweep_ray.py): same numbers as the local backend.

Runs on a local Ray instance with 2 CPUs, started once for the module; skipped when Ray is not installed.
"""

import json
import sys

import pytest
import torch
import yaml

from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.engine.local.jobs import ClientJob
from cfl.engine.local.ray_backend import local_rows, split_groups
from cfl.engine.rounds.runner import Runner
from tests.conftest import tiny_config

BASE = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 6, "clients_per_round": 5,
        "rounds_per_task": 2, "batch_size": 16, "lr": 0.05, "threads": 1, "wandb": {"mode": "disabled"}}


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is not installed (the extra ray)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_groups_are_contiguous_and_index_their_own_rows():
    jobs = [ClientJob(c, torch.tensor(ix), None, c) for c, ix in enumerate([[7, 2], [4], [9, 4], [1], [3]])]
    groups = split_groups(jobs, 2)
    assert [[j.cid for j in g] for g in groups] == [[0, 1, 2], [3, 4]]
    assert [len(g) for g in split_groups(jobs[:1], 4)] == [1]
    rows, local = local_rows(groups[0])
    assert rows.tolist() == [2, 4, 7, 9]
    assert [j.indices.tolist() for j in local] == [[2, 0], [1], [3, 1]]  # rows[local] == the original indices


def test_missing_ray_is_a_clear_error_before_any_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    hint = r'pip install -e "\.\[ray\]" in the cfl-bench checkout'
    with pytest.raises(ConfigError, match=r"'backend: ray' needs Ray.*" + hint):
        tiny_config(backend="ray")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": BASE, "grid": {"seed": [0]}, "out": str(tmp_path / "runs")}))
    assert main(["sweep", str(sweep), "--backend", "ray"]) == 2
    assert 'pip install -e ".[ray]" in the cfl-bench checkout' in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def _train(cfg, stream=None):
    from cfl.data.load import load_stream

    runner = Runner(cfg, stream or load_stream(**cfg.stream_fields(), device=torch.device("cpu")))
    runner.run()
    return runner


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("method", ["fedavg", "er"])
def test_one_run_on_ray_matches_the_local_backend(method):
    from cfl.data.load import load_stream

    local_cfg = tiny_config(method={"name": method}, threads=1)
    stream = load_stream(**local_cfg.stream_fields(), device=torch.device("cpu"))
    local = _train(local_cfg, stream)
    on_ray = _train(tiny_config(method={"name": method}, threads=1, backend="ray", ray_workers=2), stream)
    assert on_ray.progress.acc_matrix == local.progress.acc_matrix
    assert all(torch.equal(on_ray.params[k], v) for k, v in local.params.items())  # bit for bit (no dropout)
    if method == "er":  # the sampled clients' memories went to the workers (replay), the driver's states agree
        mine, theirs = local.states[0].clients, on_ray.states[0].clients
        assert mine.ids() == theirs.ids() and len(mine)
        assert all(torch.equal(mine.get(c)[k], theirs.get(c)[k]) for c in mine.ids() for k in mine.get(c))


@pytest.mark.usefixtures("ray_local")
def test_sweep_on_ray_matches_local_and_skips_complete_runs(tmp_path, capsys):
    def sweep(name):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"base": BASE, "grid": {"method.name": ["fedavg", "fedprox"]},
                                        "out": str(tmp_path / name)}))
        return str(path)

    assert main(["sweep", sweep("local")]) == 0
    assert main(["sweep", sweep("ray"), "--backend", "ray"]) == 0
    out = capsys.readouterr().out
    assert out.count("done] method=") == 2 and "| split-digits (task-IL) |" in out
    for run in ("method=fedavg", "method=fedprox"):
        a, b = (json.loads((tmp_path / d / run / "results.json").read_text()) for d in ("local", "ray"))
        assert (a["acc_matrix"], a["acc"], a["fgt"]) == (b["acc_matrix"], b["acc"], b["fgt"])
    before = (tmp_path / "ray" / "method=fedavg" / "results.json").read_text()
    assert main(["sweep", sweep("ray"), "--backend", "ray"]) == 0
    assert capsys.readouterr().out.count("already complete, skipped") == 2
    assert (tmp_path / "ray" / "method=fedavg" / "results.json").read_text() == before


@pytest.mark.usefixtures("ray_local")
def test_dropout_draws_depend_on_the_group_not_on_where_it_trains(blobs):
    import ray

    from cfl.engine.local.jobs import Hyper, derive_seed
    from cfl.engine.local.ray_backend import train_group
    from cfl.models import ModelShape, build_model

    model = build_model("mlp", ModelShape(blobs.input_shape, 3, 2, False))  # dropout 0.2/0.5/0.5
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = blobs.tasks[0].train_x, blobs.tasks[0].train_y
    jobs = [ClientJob(c, torch.arange(c * 20, c * 20 + 20), None, derive_seed(0, 0, 0, c)) for c in range(3)]
    args = ("batched", model, params, jobs, x, y, 0, Hyper(0.1, 0.0, 0.0, 1, 8), [], [], [], 1)
    here = train_group(*args)[0]
    there = ray.get(ray.remote(train_group).remote(*args))[0]
    assert all(torch.equal(here[k], there[k]) for k in here)
    torch.manual_seed(123)  # the driver's generator plays no part
    assert all(torch.equal(here[k], v) for k, v in train_group(*args)[0].items())
