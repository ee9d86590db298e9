"""FedWeIT's regularisers for a client with its own order of tasks (cfl/ops/fedweit_order.py), by hand on the layer
of tests/methods/test_fedweit_losses.py: base (2, -2); mask logits 0 (task 0, gate 1/2) and ln 3 (task 1, gate 3/4);
A^(0) = (1, 0), A^(1) = (0, -1); lambda_l1 0.1, lambda_l2 10, lambda_mask 0.2, wd 0.01."""

from __future__ import annotations

import pytest
import torch

from cfl.ops.fedweit_losses import layer_regulariser
from cfl.ops.fedweit_order import layer_regulariser_own, own_anchors
from tests.methods.test_fedweit_losses import ANCHOR, L3, D, W, params


def _vec(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def test_the_stream_order_gives_the_codes_regulariser():
    anchors = torch.cat([ANCHOR, torch.zeros_like(ANCHOR)])  # task 0 past, row 1 unused
    own = layer_regulariser_own(params(), "l", _vec(0, 1), _vec(1, 0), anchors, W).item()
    assert own == pytest.approx(layer_regulariser(params(), "l", 1, ANCHOR, W).item(), abs=1e-12)
    assert own == pytest.approx(0.2 + 0.2 * L3 + 0.01 * (0.5 + L3**2 / 2) + 10.0)


def test_a_client_on_task_0_after_task_1_anchors_task_1_by_hand():
    """L1 0.1 * (|A0| + |A1|) = 0.2, mask 0.2 * |0| = 0; decay 0.01 * |A0|^2 / 2 = 0.005, none on the base;
    drift of task 1: B * 3/4 + A1 = (1.5, -2.5) against the anchor (1.5, -1.5): 10 * 1 / 2 = 5."""
    anchors = torch.tensor([[[0.0, 0.0]], [[1.5, -1.5]]], dtype=D)
    assert layer_regulariser_own(params(), "l", _vec(1, 0), _vec(0, 1), anchors, W).item() == pytest.approx(5.205)


def test_a_clients_first_task_decays_the_base_and_has_no_drift():
    """Task 1 first: L1 0.1 * |A1| = 0.1 and 0.2 * ln 3; decay 0.01 * (|A1|^2/2 + (ln 3)^2/2 + |B|^2/2)."""
    expected = 0.1 + 0.2 * L3 + 0.01 * (0.5 + L3**2 / 2 + 4.0)
    zeros = torch.zeros(2, 1, 2, dtype=D)
    assert layer_regulariser_own(params(), "l", _vec(0, 1), _vec(0, 0), zeros, W).item() == pytest.approx(expected)


def test_own_anchors_keep_the_past_tasks_rows_only():
    anchors = own_anchors(params(), ["l"], _vec(0, 1))["l"]
    assert torch.allclose(anchors, torch.tensor([[[0.0, 0.0]], [[1.5, -2.5]]], dtype=D))
    assert not anchors.requires_grad


def test_under_per_client_orders_each_clients_past_tasks_are_its_own():
    """2 tasks, 4 clients all sampled, each through its own permutation: at the end a client's past is the first
    task of its order, the row its anchors keep."""
    from cfl.engine.rounds.runner import Runner
    from tests.conftest import method_spec, stream_for, tiny_config

    cfg = tiny_config(method=method_spec("fedweit"), num_clients=4, clients_per_round=4, weight_decay=0.0,
                      schedule={"name": "per_client_order", "every": 2})
    runner = Runner(cfg, stream_for("fedweit", "task", num_tasks=2))
    orders = [line.order for line in runner.plan.timelines]
    assert sorted(map(tuple, orders)) != [(0, 1)] * 4  # some client starts on task 1
    runner.run()
    for c, order in enumerate(orders):
        state = runner.states[0].clients.get(c)
        assert state["past"].tolist() == [1.0 if t == order[0] else 0.0 for t in range(2)]
        kept = [bool(row.abs().sum() > 0) for row in next(iter(state["anchors"].values()))]
        assert kept == [t == order[0] for t in range(2)]
