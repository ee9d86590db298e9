"""``torch.optim.LBFGS`` (no line search) on many independent problems at once, in lockstep: one batched evaluation
per iteration instead of one per problem, and the two-loop recursion on all problems' histories together.

Each problem follows torch's own algorithm (``torch/optim/lbfgs.py``, ``step`` without ``line_search_fn``): its own
history of at most ``history_size`` pairs, its own ``H_diag``, its own first step ``min(1, 1 / |g|_1) * lr``, its
own early stops (gradient below ``tolerance_grad``, directional derivative, no progress), which leave it waiting for
the next ``step`` call while the others go on. The numbers equal torch's up to the order of float sums (tests/
test_glfc_proxy.py compares them). GLFC's proxy server reconstructs every uploaded gradient with it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``evaluate(x, rows)``: the losses ``(len(rows),)`` and their gradients ``(len(rows), D)`` of problems ``rows``
#: at their points ``x (len(rows), D)``
Evaluate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _two_loop(g: torch.Tensor, dirs: torch.Tensor, stps: torch.Tensor, ro: torch.Tensor, count: torch.Tensor,
              h_diag: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The L-BFGS direction ``-H g`` per problem; the history is right-aligned (newest last, ``count`` valid), the
    problems outside ``rows`` (bool) are left as ``-g * h_diag``. An entry outside a problem's history has its
    ``ro`` zeroed, so it adds exactly nothing (``q - 0 * y``, ``r + (0 - 0) * s``)."""
    m = dirs.shape[1]
    deepest = int(count[rows].max()) if bool(rows.any()) else 0
    in_history = rows.unsqueeze(-1) & (torch.arange(m, device=g.device) >= m - count.unsqueeze(-1))
    ro = (ro * in_history).unsqueeze(-1)
    q = g.neg()
    al = torch.zeros_like(ro)
    for i in range(m - 1, m - deepest - 1, -1):
        al[:, i] = torch.linalg.vecdot(stps[:, i], q).unsqueeze(-1) * ro[:, i]
        q = torch.addcmul(q, al[:, i], dirs[:, i], value=-1)
    r = q * h_diag.unsqueeze(-1)
    for i in range(m - deepest, m):
        be = torch.linalg.vecdot(dirs[:, i], r).unsqueeze(-1) * ro[:, i]
        r = torch.addcmul(r, al[:, i] - be, stps[:, i])
    return r


def lbfgs_iterates(x0: torch.Tensor, evaluate: Evaluate, steps: int, lr: float, keep: int, max_iter: int = 20,
                   history_size: int = 100, tolerance_grad: float = 1e-7,
                   tolerance_change: float = 1e-9) -> torch.Tensor:
    """``steps`` calls of ``LBFGS.step`` on each of the ``B`` problems starting at the rows of ``x0 (B, D)``: the
    points after each of the last ``keep`` calls, ``(B, keep, D)``, oldest first."""
    if not 1 <= keep <= steps:
        raise ValueError(f"lbfgs_iterates: keep={keep} iterates of steps={steps}; need 1 <= keep <= steps")
    n, dim = x0.shape
    max_eval = max_iter * 5 // 4  # torch's default
    x = x0.detach().clone()
    dirs = x.new_zeros(n, history_size, dim)
    stps = x.new_zeros(n, history_size, dim)
    ro = x.new_zeros(n, history_size)
    count = torch.zeros(n, dtype=torch.long, device=x.device)
    h_diag, t = x.new_ones(n), x.new_zeros(n)
    d, prev_g = torch.zeros_like(x), torch.zeros_like(x)
    loss, prev_loss = (torch.zeros(n, dtype=torch.float64, device=x.device) for _ in range(2))
    n_global = torch.zeros(n, dtype=torch.long, device=x.device)
    everyone = torch.arange(n, device=x.device)
    kept = []
    for step in range(steps):
        value, g = evaluate(x, everyone)
        loss = value.detach().to(torch.float64)
        g = g.detach()
        active = g.abs().amax(-1) > tolerance_grad
        evals, n_iter = 1, 0
        while n_iter < max_iter and bool(active.any()):
            n_iter += 1
            n_global = n_global + active.long()
            first, later = active & (n_global == 1), active & (n_global > 1)
            y, s = g - prev_g, d * t.unsqueeze(-1)
            ys = (y * s).sum(-1)
            update = later & (ys > 1e-10)
            if bool(update.any()):
                w = update.view(n, 1, 1)
                dirs = torch.where(w, torch.cat([dirs[:, 1:], y.unsqueeze(1)], 1), dirs)
                stps = torch.where(w, torch.cat([stps[:, 1:], s.unsqueeze(1)], 1), stps)
                ro = torch.where(update.unsqueeze(-1), torch.cat([ro[:, 1:], (1.0 / ys).unsqueeze(-1)], 1), ro)
                count = torch.where(update, (count + 1).clamp(max=history_size), count)
                h_diag = torch.where(update, ys / (y * y).sum(-1), h_diag)
            direction = torch.where(first.unsqueeze(-1), g.neg(), _two_loop(g, dirs, stps, ro, count, h_diag, later))
            on = active.unsqueeze(-1)
            d = torch.where(on, direction, d)
            prev_g, prev_loss = torch.where(on, g, prev_g), torch.where(active, loss, prev_loss)
            first_t = (1.0 / g.abs().sum(-1)).clamp(max=1.0) * lr
            t = torch.where(active, torch.where(first, first_t, torch.full_like(t, lr)), t)
            active = active & ~((g * d).sum(-1) > -tolerance_change)
            x = torch.where(active.unsqueeze(-1), x + d * t.unsqueeze(-1), x)
            opt_cond = torch.zeros_like(active)
            rows = active.nonzero().flatten()
            if n_iter != max_iter and len(rows):
                value, grad = evaluate(x[rows], rows)
                loss = loss.index_copy(0, rows, value.detach().to(torch.float64))
                g = g.index_copy(0, rows, grad.detach())
                opt_cond = g.abs().amax(-1) <= tolerance_grad
                evals += 1
            if n_iter == max_iter or evals >= max_eval:
                break
            stalled = ((d * t.unsqueeze(-1)).abs().amax(-1) <= tolerance_change) | \
                ((loss - prev_loss).abs() < tolerance_change)
            active = active & ~opt_cond & ~stalled
        if step >= steps - keep:
            kept.append(x.clone())
    return torch.stack(kept, 1)
