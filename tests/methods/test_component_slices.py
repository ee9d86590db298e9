"""CODA-P's per-task component slices and prefix form against transcriptions of the official code's lines
(GT-RIPL/CODA-Prompt 605ac87, models/zoo.py ``CodaPrompt``): ``gram_schmidt``, the forward's ``K[0:f]`` and
``Ek``/``Ev`` split, the ortho penalty over the visible rows; and the zero rows of later tasks by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cfl.methods.component_start import task_rows_only
from cfl.pretrained.coda_prompt import ComponentPrompt, layer_orthogonality, orthogonality, visible_orthogonality
from cfl.pretrained.component_slices import from_layer_rows, gram_schmidt, layer_rows, task_slice


def _official_gram_schmidt(vv: torch.Tensor, task_count: int, pool: int, n_tasks: int,
                           generator: torch.Generator) -> torch.Tensor:
    """``CodaPrompt.gram_schmidt`` line by line (a 2-D ``vv``), ``torch.randn_like`` drawing from ``generator``."""
    def projection(u, v):
        denominator = (u * u).sum()
        if denominator < 1e-8:
            return None
        return (v * u).sum() / denominator * u

    vv = vv.T
    uu = torch.zeros_like(vv)
    pt = int(pool / n_tasks)
    s, f = int(task_count * pt), int((task_count + 1) * pt)
    if s > 0:
        uu[:, 0:s] = vv[:, 0:s].clone()
    for k in range(s, f):
        vk = torch.randn(vv[:, k].shape, generator=generator, dtype=vv.dtype)
        uk = 0
        for j in range(0, k):
            proj = projection(uu[:, j].clone(), vk)
            assert proj is not None  # the official code redraws here; cfl refuses a zero row
            uk = uk + proj
        uu[:, k] = vk - uk
    for k in range(s, f):
        uk = uu[:, k].clone()
        uu[:, k] = uk / (uk.norm())
    return uu.T


@pytest.mark.parametrize("task", [0, 1, 2])
def test_gram_schmidt_equals_the_official_loop(task: int) -> None:
    pool, tasks, width = 6, 3, 7
    trained = torch.randn(pool, width, generator=torch.Generator().manual_seed(5))  # earlier rows, not orthonormal
    start, stop = task_slice(pool, tasks, task)
    assert (start, stop) == (2 * task, 2 * task + 2)
    ours = gram_schmidt(trained, start, stop, torch.Generator().manual_seed(9))
    official = _official_gram_schmidt(trained, task, pool, tasks, torch.Generator().manual_seed(9))
    assert torch.allclose(ours, official, atol=1e-6)
    assert torch.equal(ours[:start], trained[:start])  # kept
    assert torch.equal(ours[stop:], torch.zeros(pool - stop, width))  # later tasks' rows: zero
    assert torch.allclose(ours[start:stop].norm(dim=1), torch.ones(stop - start))


def test_slices_drawn_task_after_task_are_orthonormal() -> None:
    """Against rows that are still orthonormal (each drawn by its task's Gram-Schmidt), the new rows are orthogonal
    to every row before them. (The code projects on each earlier row separately: against trained rows that are no
    longer orthogonal to one another the new rows are near, not exactly, orthogonal; the test above has that case.)"""
    rows = torch.zeros(6, 7)
    for task in range(3):
        rows = gram_schmidt(rows, *task_slice(6, 3, task), torch.Generator().manual_seed(task))
    assert torch.allclose(rows @ rows.T, torch.eye(6), atol=1e-5)


def test_gram_schmidt_refuses_a_zero_earlier_row_and_more_rows_than_the_width() -> None:
    rows = torch.randn(4, 5)
    rows[0] = 0
    with pytest.raises(ValueError, match="component 0 is zero"):
        gram_schmidt(rows, 2, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="4 components of width 3 cannot be orthogonal"):
        gram_schmidt(torch.randn(4, 3), 0, 4, torch.Generator())


def test_layer_rows_round_trip_the_prefix_tensors() -> None:
    t = torch.randn(4, 3, 2, 5)  # (pool, layers, length, D)
    rows = layer_rows(t, layered=True)
    assert [r.shape for r in rows] == [(4, 10)] * 3
    assert torch.equal(rows[1][2], t[2, 1].reshape(-1))
    assert torch.equal(from_layer_rows(rows, t, layered=True), t)
    assert torch.equal(from_layer_rows(layer_rows(t[:, 0], False), t[:, 0], False), t[:, 0])


def _official_forward(query, K, A, p, length, f):
    """``CodaPrompt.forward`` at evaluation for one layer (``K[0:f]``), returning ``[Ek, Ev]``."""
    K, A, p = K[0:f], A[0:f], p[0:f]
    a_querry = torch.einsum("bd,kd->bkd", query, A)
    n_K = F.normalize(K, dim=1)
    q = F.normalize(a_querry, dim=2)
    aq_k = torch.einsum("bkd,kd->bk", q, n_K)
    P_ = torch.einsum("bk,kld->bld", aq_k, p)
    i = int(length / 2)
    return P_[:, :i, :], P_[:, i:, :]


def _prefix_pool(pool: int = 4, length: int = 4, width: int = 6, layers: int = 2, visible: int = 2):
    """A prefix-form pool whose rows from ``visible`` on are zero (a later task's, not yet entered)."""
    prompt = ComponentPrompt(pool, length, width, layers)
    with torch.no_grad():
        for t in (prompt.prompts, prompt.keys, prompt.attention):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(t.dim())))
            t[visible:] = 0
    return prompt


def test_the_prefix_form_equals_the_official_forward_layer_by_layer() -> None:
    prompt, query = _prefix_pool(), torch.randn(3, 6)
    prefixes = prompt(query)
    assert len(prefixes) == 2 and prefixes[0].shape == (3, 2, 2, 6)  # (N, keys | values, length / 2, D)
    for layer, prefix in enumerate(prefixes):
        ek, ev = _official_forward(query, prompt.keys[:, layer], prompt.attention[:, layer],
                                   prompt.prompts[:, layer], 4, 2)  # f = 2: the zero rows are the code's exclusion
        assert torch.allclose(prefix[:, 0], ek, atol=1e-6) and torch.allclose(prefix[:, 1], ev, atol=1e-6)


def test_a_later_tasks_zero_rows_get_a_finite_gradient_that_the_step_mask_zeroes() -> None:
    prompt = _prefix_pool()
    sum(p.sum() for p in prompt(torch.randn(3, 6))).backward()
    grads = {f"prompt.{k}": getattr(prompt, k).grad for k in ("prompts", "keys", "attention")}
    assert all(torch.isfinite(g).all() for g in grads.values())
    owner = torch.tensor([0, 0, 1, 1])
    masked = task_rows_only(grads, owner, torch.zeros(3, dtype=torch.long))  # the client's task 0: rows 0, 1
    for k, g in masked.items():
        assert torch.equal(g[2:], torch.zeros_like(g[2:])), k
        assert torch.equal(g[:2], grads[k][:2]), k
    later = task_rows_only(grads, owner, torch.ones(3, dtype=torch.long))  # task 1: rows 0, 1 frozen
    assert all(torch.equal(g[:2], torch.zeros_like(g[:2])) for g in later.values())


def test_the_penalty_over_the_visible_rows_is_the_officials_over_k_0_to_f() -> None:
    rows = torch.randn(6, 5)
    visible = torch.tensor([True] * 4 + [False] * 2)
    official = ((rows[:4] @ rows[:4].T - torch.eye(4)) ** 2).mean()  # ortho_penalty(K[0:f])
    assert torch.allclose(visible_orthogonality(rows, visible), official)
    b = torch.tensor([[1.0, 1.0], [0.0, 2.0], [3.0, 3.0]])
    # rows 0, 1: B B^T - I = [[1, 2], [2, 3]], squares 1, 4, 4, 9: mean 4.5 (row 2 not visible)
    assert visible_orthogonality(b, torch.tensor([True, True, False])).item() == pytest.approx(4.5)
    layered = torch.randn(6, 3, 5)  # per layer, summed (the code adds each prefix layer's loss)
    expected = sum(orthogonality(layered[:4, i]) for i in range(3))
    assert torch.allclose(layer_orthogonality(layered, True, visible), expected)
    assert torch.allclose(layer_orthogonality(layered[:, 0], False), orthogonality(layered[:, 0]))


def test_an_odd_prefix_length_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_length 5 is odd"):
        ComponentPrompt(4, 5, 6, layers=2)


def test_the_shared_penalty_sums_each_prefix_layer_over_the_visible_rows() -> None:
    from types import SimpleNamespace

    from cfl.methods.component_start import penalty
    from cfl.pretrained.coda_prompt import orthogonality

    torch.manual_seed(0)
    params = {k: torch.randn(4, 2, 3) for k in ("prompt.prompts", "prompt.keys", "prompt.attention")}
    owner, task = torch.tensor([0, 0, 1, 1]), torch.zeros(2, dtype=torch.long)
    per_layer = sum(orthogonality(params[k][:2, i]) for k in params for i in range(2))  # task 0 sees rows 0, 1
    assert torch.allclose(penalty(SimpleNamespace(start="gram-schmidt"), params, owner, task, True), per_layer)
    every = sum(orthogonality(params[k][:, i]) for k in params for i in range(2))  # at-once: every row
    assert torch.allclose(penalty(SimpleNamespace(start="at-once"), params, owner, task, True), every)
    flat = sum(orthogonality(params[k]) for k in params)  # one set (prompt tuning): rows flattened
    assert torch.allclose(penalty(SimpleNamespace(start="at-once"), params, owner, task, False), flat)
