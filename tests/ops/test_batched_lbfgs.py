"""The lockstep L-BFGS equals ``torch.optim.LBFGS`` run on each problem alone: different histories, first steps and
early stops per problem (one starts at its minimum, one converges within a step, one is Rosenbrock's valley)."""

from __future__ import annotations

import pytest
import torch

from cfl.ops.batched_lbfgs import lbfgs_iterates


def rosenbrock(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per row: a scaled Rosenbrock sum (any dim >= 2)."""
    return scale * ((1 - x[..., :-1]) ** 2 + 100 * (x[..., 1:] - x[..., :-1] ** 2) ** 2).sum(-1)


def evaluate_with(scales: torch.Tensor):
    def evaluate(x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.detach().requires_grad_(True)
        value = rosenbrock(x, scales[rows])
        (grad,) = torch.autograd.grad(value.sum(), [x])
        return value.detach(), grad
    return evaluate


def torch_lbfgs(x0: torch.Tensor, scale: torch.Tensor, steps: int, lr: float, keep: int, history: int) -> torch.Tensor:
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([x], lr=lr, history_size=history)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = rosenbrock(x, scale)
        value.backward()
        return value

    kept = []
    for step in range(steps):
        opt.step(closure)
        if step >= steps - keep:
            kept.append(x.detach().clone())
    return torch.stack(kept)


@pytest.mark.parametrize("history", [100, 3])  # 3: the history fills up and shifts
def test_lockstep_lbfgs_equals_torch_lbfgs_per_problem(history):
    x0 = torch.tensor([[1.0, 1.0, 1.0], [-1.2, 1.0, 0.5], [0.9, 0.8, 0.7], [0.0, 0.0, 0.0]], dtype=torch.float64)
    scales = torch.tensor([1.0, 1.0, 1e-3, 0.5], dtype=torch.float64)
    got = lbfgs_iterates(x0, evaluate_with(scales), steps=6, lr=0.5, keep=3, history_size=history)
    assert got.shape == (4, 3, 3)
    for i in range(4):
        want = torch_lbfgs(x0[i], scales[i], steps=6, lr=0.5, keep=3, history=history)
        # the sums' order differs (1e-14 after one step); Rosenbrock's valley grows that to 2e-7, a slip in the
        # algorithm (a history entry, a step size, a stop) moves a point by 1e-3 or more
        assert torch.allclose(got[i], want, rtol=0, atol=1e-6), (i, got[i], want)
    assert torch.equal(got[0], x0[:1].expand(3, 3))  # at the minimum from the start: never moves
    assert not torch.equal(got[1, 0], got[1, -1])  # still moving: the test would catch a stalled problem


def test_lockstep_lbfgs_refuses_more_kept_iterates_than_steps():
    with pytest.raises(ValueError, match="keep=3"):
        lbfgs_iterates(torch.zeros(1, 2), evaluate_with(torch.ones(1)), steps=2, lr=0.1, keep=3)
