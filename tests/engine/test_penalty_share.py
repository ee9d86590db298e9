"""Each quadratic penalty's share of its clients' local loss, in ``method_stats``."""

import pytest
import torch

from cfl.engine.local.jobs import ClientOutcome
from cfl.engine.local.penalty_share import client_shares, record_round
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import Computes, Method, NoHyperparams, Quadratic, RoundTerms
from cfl.metrics.results import build_results
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import make_stream
from tests.engine.test_penalties import PENALTY_METHODS


class Pull(Method):
    """``P = 2/2 * sum w^2``: the penalty at w = (1, 1) is 2, at (2, 0) 4."""

    name = "pull"
    Hyperparams = NoHyperparams

    computes = Computes(terms=("penalty",))

    def round_terms(self, ctx):
        return RoundTerms({"w": Quadratic(2.0, torch.zeros_like(ctx.global_params["w"]))})


def outcome(cid, loss, finite=True):
    return ClientOutcome(cid=cid, num_samples=1, mean_loss=loss, finite=finite)


def test_the_share_by_hand():
    """Clients (P, L) = (2, 6), (4, 4) and a third dropped: shares 0.25 and 0.5."""
    method = Pull(NoHyperparams(), None)
    trained = {"w": torch.tensor([[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]])}
    outcomes = [outcome(0, 6.0), outcome(1, 4.0), outcome(2, 1.0)]
    total, n = client_shares(method, MethodState(), {}, {"w": torch.zeros(2)}, trained, outcomes,
                             [True, True, False])
    assert n == 2 and float(total) == pytest.approx(0.75)
    state = MethodState()
    record_round([method], [state], [{}], {"w": torch.zeros(2)}, trained, outcomes, [True, True, False], task=0)
    last = {"w": trained["w"][2:]}
    record_round([method], [state], [{}], {"w": torch.zeros(2)}, last, [outcome(2, 162.0)], [True], task=1)
    stats = state.server["stats"]  # task 1: P = 162, L = 162: share 0.5
    assert stats["penalty_share_by_task"] == pytest.approx({"0": 0.375, "1": 0.5})
    assert stats["penalty_share_client_rounds_by_task"] == {"0": 2, "1": 1}
    assert stats["penalty_share"] == pytest.approx((0.25 + 0.5 + 0.5) / 3)


@pytest.mark.parametrize("name", PENALTY_METHODS)
def test_every_penalising_method_reports_its_share_in_method_stats(name):
    cfg = from_dict({"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}, "method": {"name": name}})
    runner = Runner(cfg, make_stream("task", num_tasks=2))
    runner.run()
    stats = build_results(runner.snapshot(), 0.0)["method_stats"][name]
    if name == "scaffold":  # a linear correction alone has no loss value of its own: no share
        assert "penalty_share" not in stats
        return
    assert 0.0 <= stats["penalty_share"] < 1.0
    assert set(stats["penalty_share_by_task"]) == {"0", "1"}


def test_a_stronger_penalty_has_a_larger_share_and_fedavg_reports_none():
    def share(method):
        cfg = from_dict({"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8,
                         "lr": 0.1, "wandb": {"mode": "disabled"}, "method": method})
        runner = Runner(cfg, make_stream("task", num_tasks=2))
        runner.run()
        return build_results(runner.snapshot(), 0.0)["method_stats"][method["name"]].get("penalty_share")

    weak, strong = share({"name": "fedprox", "mu": 0.001}), share({"name": "fedprox", "mu": 1.0})
    assert 0.0 < weak < strong < 1.0
    assert share({"name": "fedavg"}) is None
