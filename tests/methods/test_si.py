"""SI+FL (Zenke et al. 2017): the path integral of one step, the importance at a task end, the surrogate penalty,
all on hand-computed tensors; and a run whose clients' importance is what their steps summed."""

import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientRound, ClientRoundStart, Step
from cfl.methods.si import SI, SIHyperparams
from cfl.methods.training_hooks import ClientEndContext
from cfl.validation import from_dict
from tests.conftest import make_stream


def _step(grads, params, state, carry, moved=None) -> Step:
    return Step(params, grads, None, None, None, None, None, {}, {}, state, carry, 0.1, 0, None, moved=moved)


def _carry_start(si: SI, global_params, state):
    return si.client_start(ClientRoundStart("carry", {}, state, global_params=global_params)).carry


def test_a_step_adds_minus_gradient_times_move_to_the_path():
    si = SI(SIHyperparams(c=0.5, xi=0.01), None)
    carry = _carry_start(si, {"w": torch.tensor([1.0, 2.0])}, {})
    assert torch.equal(carry["path"]["w"], torch.zeros(2))
    assert torch.equal(carry["start"]["w"], torch.tensor([1.0, 2.0]))
    out = si.carry_step(_step({"w": torch.tensor([2.0, -1.0])}, {"w": torch.tensor([1.0, 2.0])}, {}, carry,
                        {"w": torch.tensor([-0.2, 0.1])}))
    # -g * moved = (-2 * -0.2, 1 * 0.1) = (0.4, 0.1)
    assert torch.allclose(out["path"]["w"], torch.tensor([0.4, 0.1]))


def test_the_path_leaves_out_the_surrogate_gradient():
    """With omega = (1, 4), anchor (0, 0), params (1, 1), c = 0.5: the surrogate's gradient is 2c omega (w - w*) =
    (1, 4); a step gradient (3, 6) is the task loss's (2, 2) plus it."""
    si = SI(SIHyperparams(c=0.5, xi=0.01), None)
    state = {"omega": {"w": torch.tensor([1.0, 4.0])}, "start": {"w": torch.zeros(2)}}
    carry = {"path": {"w": torch.zeros(2)}, "start": {"w": torch.zeros(2)}}
    out = si.carry_step(_step({"w": torch.tensor([3.0, 6.0])}, {"w": torch.ones(2)}, state, carry,
                        {"w": torch.tensor([-1.0, -1.0])}))
    assert torch.allclose(out["path"]["w"], torch.tensor([2.0, 2.0]))


def test_task_end_importance_and_penalty():
    """path (0.4, 0.1), the task moved the global model by (0.2, 0): Omega = (0.4 / (0.04 + 0.01), 0.1 / 0.01)
    = (8, 10); the penalty is c Omega (w - w*)^2, a Quadratic of weight 2 c Omega at the new start."""
    si = SI(SIHyperparams(c=0.5, xi=0.01), None)
    state = {"path": {"w": torch.tensor([0.4, 0.1])}, "start": {"w": torch.tensor([1.0, 2.0])}}
    final = {"w": torch.tensor([1.2, 2.0])}
    si.client_end(ClientEndContext("task_end", None, final, None, state, {}, None))
    assert torch.allclose(state["omega"]["w"], torch.tensor([8.0, 10.0]))
    assert torch.equal(state["start"]["w"], final["w"]) and "path" not in state
    q = si.round_terms(ClientRound("penalty", state, final, {})).penalty["w"]
    assert torch.allclose(q.weight, torch.tensor([8.0, 10.0])) and torch.equal(q.anchor, final["w"])
    si.client_end(ClientEndContext("task_end", None, {"w": torch.tensor([1.2, 2.1])}, None, state, {},
                                   None))  # no round trained
    assert torch.allclose(state["omega"]["w"], torch.tensor([8.0, 10.0]))  # nothing added
    assert torch.equal(state["start"]["w"], torch.tensor([1.2, 2.1]))


def test_a_run_sums_each_clients_steps_into_its_state():
    """One client, one round, plain SGD: the path equals sum over steps of -g * (-lr g) = lr * sum g^2 > 0."""
    cfg = from_dict({"num_clients": 1, "clients_per_round": 1, "rounds_per_task": 1, "batch_size": 8, "lr": 0.1,
                     "method": {"name": "si"}, "wandb": {"mode": "disabled"}})
    runner = Runner(cfg, make_stream("task", num_tasks=2))
    runner.run_round(0, 0)
    state = runner.states[0].clients.get(0)
    assert set(state) == {"path", "start"}
    assert all(bool((p >= 0).all()) and float(p.sum()) > 0 for p in state["path"].values())


def test_a_second_task_end_adds_its_importance_to_the_first():
    """Task 0: path (0.4, 0.1), move (0.2, 0): Omega (8, 10). Task 1: path (0.5, 0.2), move (0, 0.1) with xi 0.01:
    (50, 10); Omega = (58, 20), the sum over the tasks (the paper's Eq. 5 sums every finished task)."""
    si = SI(SIHyperparams(c=0.5, xi=0.01), None)
    state = {"path": {"w": torch.tensor([0.4, 0.1])}, "start": {"w": torch.tensor([1.0, 2.0])}}
    si.client_end(ClientEndContext("task_end", None, {"w": torch.tensor([1.2, 2.0])}, None, state, {}, None))
    state["path"] = {"w": torch.tensor([0.5, 0.2])}
    si.client_end(ClientEndContext("task_end", None, {"w": torch.tensor([1.2, 2.1])}, None, state, {}, None))
    assert torch.allclose(state["omega"]["w"], torch.tensor([58.0, 20.0]))


def _weight_decay_task(si: SI, state: dict) -> None:
    """One SGD step (lr 0.1, weight decay 1) from w = (1, 1) with loss gradients g = (-0.1, 0.5): the move
    -lr (g + wd w) = (-0.09, -0.15); the path -g * move = (-0.009, 0.075): weight decay moved w_0 up its loss's
    gradient. The task's global move (0.1, 0) and xi 0.01: the task's importance (-0.009 / 0.02, 0.075 / 0.01) =
    (-0.45, 7.5)."""
    carry = _carry_start(si, {"w": torch.ones(2)}, state)
    carry = si.carry_step(_step({"w": torch.tensor([-0.1, 0.5])}, {"w": torch.ones(2)}, state, carry,
                          {"w": torch.tensor([-0.09, -0.15])}))
    state.update(carry)
    si.client_end(ClientEndContext("task_end", None, {"w": state["start"]["w"] + torch.tensor([0.1, 0.0])}, None,
                                   state, {}, None))


def test_weight_decay_gives_a_negative_importance_which_clip_sets_to_zero_as_the_authors_code():
    paper, code = SI(SIHyperparams(xi=0.01), None), SI(SIHyperparams(xi=0.01, clip=True), None)
    kept, clipped = {}, {}
    _weight_decay_task(paper, kept)
    _weight_decay_task(code, clipped)
    assert torch.allclose(kept["omega"]["w"], torch.tensor([-0.45, 7.5]))  # the paper's: unclipped (the default)
    assert torch.allclose(clipped["omega"]["w"], torch.tensor([0.0, 7.5]))


def test_the_clip_is_of_the_sum_over_tasks():
    """pathint's Omega <- relu(Omega + new): an earlier importance 0.3 plus this task's -0.45 gives 0, not 0.3."""
    si = SI(SIHyperparams(xi=0.01, clip=True), None)
    state = {"omega": {"w": torch.tensor([0.3, 0.0])}, "start": {"w": torch.ones(2)}}
    _weight_decay_task(si, state)
    assert torch.allclose(state["omega"]["w"], torch.tensor([0.0, 7.5]))
