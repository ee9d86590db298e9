"""FedWeIT's decomposed weight B * m + A + sum_k alpha_k kb_k on hand values, for linear and conv layouts.

The layer: 2 output units, base rows (1, 2) and (3, 4); mask 1/2 on unit 0, 1 on unit 1 (a per-unit mask scales a
whole output row); A = [[0.1, 0], [0, -1]]; two knowledge-base entries, all ones and 2 * identity, with attention
1/2 and -1. B * m = [[0.5, 1], [3, 4]]; + A = [[0.6, 1], [3, 3]]; kb sum = [[-1.5, 0.5], [0.5, -1.5]]."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import vmap

from cfl.models.fedweit_weight import decomposed_weight, fold_knowledge, gate, hard_threshold, knowledge_sum

D = torch.float64
BASE = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=D)
MASK = torch.tensor([0.5, 1.0], dtype=D)
ADAPTIVE = torch.tensor([[0.1, 0.0], [0.0, -1.0]], dtype=D)
KB = torch.stack([torch.ones(2, 2, dtype=D), 2 * torch.eye(2, dtype=D)])
ATTENTION = torch.tensor([0.5, -1.0], dtype=D)
THETA = torch.tensor([[-0.9, 1.5], [3.5, 1.5]], dtype=D)


def test_linear_weight_by_hand():
    assert torch.allclose(decomposed_weight(BASE, MASK, ADAPTIVE, KB, ATTENTION), THETA)
    assert torch.allclose(decomposed_weight(BASE, MASK, ADAPTIVE), torch.tensor([[0.6, 1.0], [3.0, 3.0]], dtype=D))


def test_conv_weight_masks_whole_output_filters():
    """A conv weight (out, in, kh, kw) = (2, 1, 1, 2): each output filter holds one row of the linear case."""
    conv = (2, 1, 1, 2)
    theta = decomposed_weight(BASE.view(conv), MASK, ADAPTIVE.view(conv), KB.view(2, *conv), ATTENTION)
    assert torch.allclose(theta, THETA.view(conv))


def test_per_task_weights_stack():
    """Leading task dims on A, mask and attention give each task's weight, as computed one task at a time."""
    adaptive = torch.stack([ADAPTIVE, -ADAPTIVE])
    mask = torch.stack([MASK, MASK.flip(0)])
    attention = torch.stack([ATTENTION, torch.zeros(2, dtype=D)])
    every = decomposed_weight(BASE, mask, adaptive, KB, attention)
    assert torch.allclose(every[0], THETA)
    # task 1: mask (1, 0.5) -> B * m = [[1, 2], [1.5, 2]]; - A -> [[0.9, 2], [1.5, 3]]; no knowledge base
    assert torch.allclose(every[1], torch.tensor([[0.9, 2.0], [1.5, 3.0]], dtype=D))


def test_weight_under_vmap_matches_per_client():
    """A stack of clients (the batched engine) composes each client's weight as one client does."""
    bases = torch.stack([BASE, 2 * BASE])
    stacked = vmap(decomposed_weight)(bases, MASK.expand(2, 2), ADAPTIVE.expand(2, 2, 2), KB.expand(2, 2, 2, 2),
                                      ATTENTION.expand(2, 2))
    assert torch.allclose(stacked[0], THETA)
    assert torch.allclose(stacked[1], THETA + BASE * MASK.view(2, 1))


def test_gate_is_the_sigmoid():
    assert torch.allclose(gate(torch.tensor([0.0, math.log(3)])), torch.tensor([0.5, 0.75]))


def test_hard_threshold_keeps_strictly_larger_magnitudes():
    x = torch.tensor([0.002, -0.0005, -0.003, 0.001])
    assert torch.equal(hard_threshold(x, 1e-3), torch.tensor([0.002, 0.0, -0.003, 0.0]))


def test_knowledge_base_needs_attention():
    with pytest.raises(ValueError, match="attention"):
        decomposed_weight(BASE, MASK, ADAPTIVE, KB)


def test_fold_keeps_the_task_weight_and_clears_its_attention():
    """Folding task 0's knowledge sum into kb_mix leaves its weight unchanged with the knowledge base gone."""
    attention = torch.stack([ATTENTION, torch.tensor([1.0, 1.0], dtype=D)])
    kb_mix = torch.zeros(2, 2, 2, dtype=D)
    folded, left = fold_knowledge(kb_mix, attention, KB, 0)
    assert torch.allclose(folded[0], knowledge_sum(KB, ATTENTION))
    assert torch.equal(folded[1], kb_mix[1]) and torch.equal(left[1], attention[1])
    assert torch.equal(left[0], torch.zeros(2, dtype=D))
    assert torch.allclose(decomposed_weight(BASE, MASK, ADAPTIVE) + folded[0], THETA)
    assert torch.equal(kb_mix, torch.zeros(2, 2, 2, dtype=D))  # inputs untouched
