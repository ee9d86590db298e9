"""GEM+FL: Gradient Episodic Memory (Lopez-Paz & Ranzato, "Gradient Episodic Memory for Continual Learning",
NeurIPS 2017, arXiv 1706.08840) on each client, with its episodic memory of earlier tasks
(:class:`~cfl.methods.episodic_memory.EpisodicMemory`).

Each local step takes the loss gradient ``g_k`` of each earlier task's memory samples at the step's parameters. Where
the step's gradient ``g`` conflicts with any (``g . g_k < 0``), the step takes the projection of the paper's Eq. 10-13
instead: with ``M`` the (tasks x parameters) matrix of the ``g_k``, the dual quadratic programme

    minimise_v  1/2 v^T (M M^T + eps I) v + (M g)^T v   subject to  v >= margin,

then ``g~ = M^T v + g``. ``margin`` is the paper's gamma ("a small constant added to v*", written as the dual's
lower bound, as the authors' code does with its ``memory_strength``, 0.5); ``eps`` keeps the matrix positive
definite (the authors' 1e-3). The programme is solved in float64 by scipy's bounded least squares
(``scipy.optimize.lsq_linear``, method ``bvls``) on its Cholesky form ``||L^T v + L^-1 M g||^2``: a solver
outside torch, so GEM trains one client after another (the sequential path). The memory is not trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cfl.config.schema import field
from cfl.methods.base import Computes, Step
from cfl.methods.bounds import SAMPLES_MAX
from cfl.methods.episodic_memory import EpisodicMemory
from cfl.tensors import Params


@dataclass(frozen=True)
class GEMHyperparams:
    mem_per_client: int = field(100, "episodic memory slots per client (all earlier tasks together, split "
                                "equally over them)", min=1, max=SAMPLES_MAX)
    margin: float = field(0.5, "gamma: lower bound of the dual variables (the authors' memory_strength, 0.5, "
                          "from a grid of 0..1; at most 10, where the memories' gradients outweigh the step's)",
                          min=0.0, max=10.0)
    eps: float = field(1e-3, "added to the diagonal of M M^T (the authors' 1e-3; at most 1e3, which swamps "
                        "squared gradient norms of 1e-2..1e2)", gt=0.0, max=1e3)


def gem_dual(memories: np.ndarray, g: np.ndarray, margin: float, eps: float) -> np.ndarray:
    """``v`` minimising ``1/2 v^T (M M^T + eps I) v + (M g)^T v`` over ``v >= margin`` (``memories`` = M)."""
    from scipy.linalg import cho_factor, solve_triangular  # scipy loads in ~0.3 s: only where GEM steps
    from scipy.optimize import lsq_linear

    gram = memories @ memories.T + eps * np.eye(len(memories))
    lower, _ = cho_factor(gram, lower=True)
    lower = np.tril(lower)
    target = -solve_triangular(lower, memories @ g, lower=True)
    return lsq_linear(lower.T, target, bounds=(margin, np.inf), method="bvls").x


class GEM(EpisodicMemory):
    name = "gem"
    about = "GEM+FL: each client projects its step by a QP over its memory's per-task gradients (2017)"
    Hyperparams = GEMHyperparams
    computes = Computes(sequential_reason="its step_gradient solves GEM's quadratic programme with scipy, outside "
                                          "torch")

    def step_gradient(self, step: Step) -> Params | None:
        if "valid" not in step.state:
            return None
        valid, tasks = step.state["valid"], step.state["task"]
        names = list(step.grads)
        memories = []
        for t in torch.unique(tasks[valid]).tolist():
            rows = valid & (tasks == t)
            ref = step.gradient(step.state["x"][rows], step.state["y"][rows], tasks[rows])
            memories.append(torch.cat([ref[k].flatten() for k in names]))
        g = torch.cat([step.grads[k].flatten() for k in names])
        M = torch.stack(memories)
        if bool((M @ g >= 0).all()):
            return None
        v = gem_dual(M.double().cpu().numpy(), g.double().cpu().numpy(), self.hparams.margin, self.hparams.eps)
        new = (M.T.double() @ torch.from_numpy(v).to(M.device) + g.double()).to(g.dtype)
        out, start = {}, 0
        for k in names:
            n = step.grads[k].numel()
            out[k] = new[start : start + n].view_as(step.grads[k])
            start += n
        return out
