"""GLFC's exemplar memory: herding by hand and against a brute-force choice; the per-client budget."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from cfl.ops.glfc_memory import herding, per_class_quota, refill

# a = (1, 0), b = (0, 1), c = (1, 1) (normalised to (r, r), r = 1/sqrt 2); mean mu = ((1 + r) / 3, (1 + r) / 3)
ABC = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_herding_by_hand():
    """Step 1: c is nearest mu (0.195 against 0.714). Step 2: (c + a) / 2 and (c + b) / 2 are mirror images, both
    0.357 from mu: the tie goes to a, the lower index. Step 3: b, the one left."""
    r = 1 / math.sqrt(2)
    mu = np.array([(1 + r) / 3] * 2)
    assert np.linalg.norm(mu - [r, r]) < np.linalg.norm(mu - [1, 0])
    assert herding(ABC, 3).tolist() == [2, 0, 1]
    assert herding(ABC * torch.tensor([[3.0], [0.5], [7.0]]), 3).tolist() == [2, 0, 1]  # features are normalised


def test_the_code_quirk_may_choose_a_sample_again():
    """With every sample a candidate at every step, c stays nearest: (c + c) / 2 = c is 0.195 from mu."""
    assert herding(ABC, 3, repeats=True).tolist() == [2, 2, 2]
    assert herding(ABC, 5, repeats=True).tolist() == [2] * 5


def test_fewer_samples_than_the_quota_keeps_them_all():
    assert sorted(herding(ABC, 7).tolist()) == [0, 1, 2]
    assert herding(ABC, 0).tolist() == []


def brute_force(features: np.ndarray, m: int, repeats: bool) -> list[int]:
    """Herding as a search over every ordered choice of ``m`` samples: the greedy choice is the one whose sequence of
    distances ``|| mu - mean(first i chosen) ||``, i = 1..m, is lexicographically smallest (ties: smaller indices)."""
    f = features / np.linalg.norm(features, axis=1, keepdims=True)
    mu = f.mean(0)
    choices = itertools.product(range(len(f)), repeat=m) if repeats else itertools.permutations(range(len(f)), m)
    def key(choice):
        prefix = np.cumsum(f[list(choice)], axis=0) / np.arange(1, m + 1)[:, None]
        return (tuple(np.round(np.linalg.norm(mu - prefix, axis=1), 12)), choice)
    return list(min(choices, key=key))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("repeats", [False, True])
def test_herding_equals_the_brute_force_choice(seed, repeats):
    features = np.random.default_rng(seed).normal(size=(6, 3))
    assert herding(torch.tensor(features), 4, repeats).tolist() == brute_force(features, 4, repeats)


def test_refill_shares_the_budget_over_every_learned_class():
    """A memory of 4 holding class 0 (4 exemplars in herding order) learns class 1: 2 per class."""
    sets = {0: torch.tensor([5, 3, 1, 0])}
    out = refill(sets, {1: ABC}, memory_size=4)
    assert out[0].tolist() == [5, 3] and out[1].tolist() == [2, 0]
    assert per_class_quota(2000, 30) == 66
    assert {c: r.tolist() for c, r in refill({}, {7: ABC, 8: ABC}, memory_size=3).items()} == {7: [2], 8: [2]}


def test_refill_refuses_a_class_twice_and_an_empty_memory():
    with pytest.raises(ValueError, match=r"classes \[0\]"):
        refill({0: torch.tensor([1])}, {0: ABC}, memory_size=4)
    with pytest.raises(ValueError, match="at least one class"):
        per_class_quota(10, 0)
