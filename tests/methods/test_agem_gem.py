"""A-GEM+FL and GEM+FL: their gradient rewrites on hand-computed tensors, GEM's quadratic programme against its
closed form and its constraints, and the paths the engine takes for them."""

import numpy as np
import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods.agem import AGEM, AGEMHyperparams
from cfl.methods.base import Samples, Step
from cfl.methods.gem import GEM, GEMHyperparams, gem_dual
from cfl.validation import from_dict
from tests.conftest import make_stream


def _step(g, samples=None, state=None, refs=None) -> Step:
    def gradient(x, y, task, weight=None):  # noqa: ARG001
        return refs[int(task[0])] if refs else {"w": torch.zeros(2)}
    return Step({"w": torch.zeros(2)}, {"w": g}, None, None, None, None, samples, {}, {}, state or {}, {}, 0.1, 0,
                gradient)


ONE = Samples(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.ones(1))


@pytest.mark.parametrize(("g", "expected"), [((-2.0, 3.0), (0.0, 3.0)), ((2.0, 3.0), (2.0, 3.0))])
def test_agem_projects_a_conflicting_gradient_and_keeps_the_others(g, expected):
    agem = AGEM(AGEMHyperparams(), None)
    refs = {0: {"w": torch.tensor([1.0, 0.0])}}
    out = agem.step_gradient(_step(torch.tensor(g), ONE, refs=refs))["w"]
    assert torch.allclose(out, torch.tensor(expected))


def test_agem_divides_by_the_squared_norm_of_a_reference_off_the_axes():
    """g_ref = (1, 2), g = (-3, 1): g . g_ref = -1, ||g_ref||^2 = 5 (sum |r| would give 3): g - (-1/5) g_ref =
    (-2.8, 1.4), orthogonal to g_ref."""
    agem = AGEM(AGEMHyperparams(), None)
    refs = {0: {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}}
    out = agem.step_gradient(_step(torch.tensor([-3.0, 1.0], dtype=torch.float64), ONE, refs=refs))["w"]
    assert torch.allclose(out, torch.tensor([-2.8, 1.4], dtype=torch.float64), atol=1e-12)


def test_agem_without_memory_changes_nothing():
    agem = AGEM(AGEMHyperparams(), None)
    assert agem.step_gradient(_step(torch.tensor([1.0, 2.0]))) is None
    # a client padded with weight-0 rows has g_ref = 0 (the weighted mean of nothing): unchanged
    g = torch.tensor([1.0, 2.0])
    assert torch.equal(agem.step_gradient(_step(g, ONE, refs={0: {"w": torch.zeros(2)}}))["w"], g)


def test_gem_dual_with_one_memory_is_the_closed_form():
    """One constraint: minimise 1/2 (m.m + eps) v^2 + (m.g) v over v >= margin: v = max(margin, -m.g/(m.m+eps))."""
    m, g = np.array([[1.0, 0.0]]), np.array([-2.0, 3.0])
    for margin in (0.0, 0.5, 5.0):
        v = gem_dual(m, g, margin, 1e-3)
        assert v == pytest.approx([max(margin, 2.0 / 1.001)], abs=1e-9)


def test_gem_projection_satisfies_every_constraint():
    """Two memories, both violated: g~ = M^T v + g has g~ . g_k >= 0 for each, and equals the minimiser of
    ||g~ - g|| subject to them (margin 0, eps tiny): the projection onto the cone, checked by brute force."""
    gem = GEM(GEMHyperparams(margin=0.0, eps=1e-9), None)
    refs = {0: {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)},
            1: {"w": torch.tensor([1.0, 1.0], dtype=torch.float64)}}
    state = {"valid": torch.tensor([True, True]), "task": torch.tensor([0, 1]), "x": torch.zeros(2, 2),
             "y": torch.zeros(2, dtype=torch.long)}
    g = torch.tensor([-3.0, 1.0], dtype=torch.float64)
    out = gem.step_gradient(_step(g, state=state, refs=refs))["w"]
    assert all(float(out @ r["w"]) >= -1e-6 for r in refs.values())  # eps shifts it by ~1e-9
    grid = torch.stack(torch.meshgrid(torch.linspace(-5, 5, 1001, dtype=torch.float64),
                                      torch.linspace(-5, 5, 1001, dtype=torch.float64), indexing="ij"), -1).view(-1, 2)
    feasible = grid[(grid @ refs[0]["w"] >= 0) & (grid @ refs[1]["w"] >= 0)]
    best = feasible[(feasible - g).norm(dim=1).argmin()]
    assert torch.allclose(out, best, atol=0.02)
    ok = torch.tensor([3.0, 1.0], dtype=torch.float64)  # no conflict: unchanged
    assert gem.step_gradient(_step(ok, state=state, refs=refs)) is None


def test_gem_projects_when_one_memory_is_violated_and_another_satisfied():
    """g_0 = (1, 0), g_1 = (0, 1), g = (-1, 2): memory 0 violated (-1), memory 1 satisfied (2); the projection onto
    {g~ . g_k >= 0} (margin 0, eps tiny) is (0, 2)."""
    gem = GEM(GEMHyperparams(margin=0.0, eps=1e-12), None)
    refs = {0: {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)},
            1: {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}}
    state = {"valid": torch.tensor([True, True]), "task": torch.tensor([0, 1]), "x": torch.zeros(2, 2),
             "y": torch.zeros(2, dtype=torch.long)}
    out = gem.step_gradient(_step(torch.tensor([-1.0, 2.0], dtype=torch.float64), state=state, refs=refs))
    assert out is not None and torch.allclose(out["w"], torch.tensor([0.0, 2.0], dtype=torch.float64), atol=1e-9)


def test_gem_trains_sequentially_and_agem_on_vmap_saying_why(capsys):
    for name, line in (("gem", "engine: sequential path (reason: method gem: its step_gradient solves"),
                       ("agem", "engine: vmap path (reason: method agem declares draws 'step', a step hook")):
        cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 8,
                         "method": {"name": name, "mem_per_client": 10}, "wandb": {"mode": "disabled"}})
        runner = Runner(cfg, make_stream("task", num_tasks=2))
        runner.run()
        assert line in capsys.readouterr().err
        assert runner.snapshot().engine_path["path"] == line.split()[1]
