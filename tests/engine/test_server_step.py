"""The server step: optimiser, GMA mask, then the methods' transforms (FOT projects the step taken)."""

import math

import pytest
import torch

from cfl.engine.local.jobs import ClientOutcome
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server import NonFiniteError
from cfl.validation import from_dict
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


SIZES = [1, 2, 3, 4]  # the four clients' sample counts: shares 0.1, 0.2, 0.3, 0.4


def _hand_round(updates: list[float], **kw) -> tuple[Runner, dict[str, torch.Tensor]]:
    """One round of task 0 in which client c holds SIZES[c] samples and returns ``w + updates[c]`` (every entry).

    The trainer is replaced, so the server step is checked against hand-computed values only.
    """
    runner = _runner(num_clients=4, clients_per_round=4, **kw)
    runner.schedule._partitions = {0: [torch.arange(n) for n in SIZES]}

    def trainer(model, params, jobs, *args):  # noqa: ARG001 - the engine's trainer signature
        trained = {k: torch.stack([v + updates[j.cid] for j in jobs]) for k, v in params.items()}
        finite = [math.isfinite(updates[j.cid]) for j in jobs]
        return trained, [ClientOutcome(j.cid, len(j.indices), 0.0, ok) for j, ok in zip(jobs, finite, strict=True)]

    runner.trainer = trainer
    before = {k: v.clone() for k, v in runner.params.items()}
    runner.run_round(0, 0)
    return runner, before


def _assert_step(runner: Runner, before: dict[str, torch.Tensor], expected: float) -> None:
    for k, w in before.items():
        assert torch.allclose(runner.params[k] - w, torch.full_like(w, expected), atol=1e-6), k


def test_fedavg_step_is_the_sample_weighted_mean_times_server_lr():
    # 0.1 * 1 + 0.2 * 2 + 0.3 * 3 + 0.4 * 4 = 3.0 (the unweighted mean would be 2.5), times server_lr 0.5
    runner, before = _hand_round([1.0, 2.0, 3.0, 4.0], method={"name": "fedavg"}, server_lr=0.5)
    _assert_step(runner, before, 1.5)


@pytest.mark.parametrize(("tau", "expected"), [(0.5, -0.2), (0.6, -0.1), (0.0, -0.2)])
def test_gma_mask_at_the_threshold_keeps_the_full_step(tau, expected):
    # signs +,+,+,-: agreement |mean sign| = 0.5; weighted mean 0.1 + 0.4 + 0.9 - 1.6 = -0.2;
    # mask 1 when 0.5 >= tau, else 0.5
    runner, before = _hand_round([1.0, 2.0, 3.0, -4.0], method={"name": "fedavg"},
                                 aggregator={"name": "gma", "tau": tau})
    _assert_step(runner, before, expected)


def test_skip_client_drops_the_bad_client_from_the_weighted_mean():
    # client 3 is dropped: (0.1 * 1 + 0.2 * 2 + 0.3 * 3) / 0.6 = 14 / 6
    with pytest.warns(UserWarning, match=r"client\(s\) \[3\]"):
        runner, before = _hand_round([1.0, 2.0, 3.0, float("nan")], method={"name": "fedavg"},
                                     on_nonfinite="skip_client")
    _assert_step(runner, before, 14 / 6)


def test_skip_client_still_stops_when_every_client_is_bad():
    with pytest.raises(NonFiniteError, match=r"client\(s\) \[0, 1, 2, 3\]"):
        _hand_round([float("nan")] * 4, method={"name": "fedavg"}, on_nonfinite="skip_client")
