"""The server step: optimiser, GMA mask, then the methods' transforms (FOT projects the step taken)."""

import torch

from cfl.config import from_dict
from cfl.engine.runner import Runner
from tests.conftest import make_stream


def _runner(**kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "fot", "eps": 0.9}}
    base.update(kw)
    return Runner(from_dict(base), make_stream("domain", num_tasks=2))


def test_fot_projects_the_final_step_of_an_adaptive_server_with_gma():
    runner = _runner(plugins=[{"name": "fedadam", "server_lr": 0.05}], aggregator={"name": "gma", "tau": 0.6})
    runner.run_round(0, 0)
    runner.run_round(0, 1)
    runner.task_end(0)
    basis = runner.states[0].server["basis"]
    assert basis, "GPSE built no basis"
    before = {k: v.clone() for k, v in runner.params.items()}
    runner.run_round(1, 0)
    for name, b in basis.items():
        step = runner.params[name] - before[name]
        assert step.norm() > 0
        assert (step @ b).norm() / step.norm() < 1e-5, name


def test_plain_fedavg_step_is_the_weighted_mean():
    runner = _runner(method={"name": "fedavg"}, server_lr=0.5)
    before = {k: v.clone() for k, v in runner.params.items()}
    runner.run_round(0, 0)
    runner2 = _runner(method={"name": "fedavg"}, server_lr=1.0)
    runner2.run_round(0, 0)
    for k in before:
        full = runner2.params[k] - before[k]
        assert torch.allclose(runner.params[k] - before[k], 0.5 * full, atol=1e-6)
