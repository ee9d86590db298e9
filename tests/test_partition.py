import numpy as np
import pytest

from cfl.data.partition import partition
from cfl.schema import ConfigError

LABELS = np.repeat(np.arange(10), 40)  # 400 samples, 10 classes


def _check_disjoint_cover(parts):
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist()))
    return allidx


@pytest.mark.parametrize("name", ["iid", "shards", "dirichlet", "quantity"])
def test_partitions_are_disjoint_and_seeded(name):
    a = partition(name, LABELS, 10, seed=3, task=0)
    b = partition(name, LABELS, 10, seed=3, task=0)
    c = partition(name, LABELS, 10, seed=4, task=0)
    d = partition(name, LABELS, 10, seed=3, task=1)
    assert len(a) == 10
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=False))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=False))
    assert not all(np.array_equal(x, y) for x, y in zip(a, d, strict=False))
    allidx = _check_disjoint_cover(a)
    assert len(allidx) == len(LABELS)
    assert min(len(p) for p in a) >= 1


def test_iid_equal_sizes_all_labels():
    parts = partition("iid", LABELS, 8, seed=0, task=0)
    assert [len(p) for p in parts] == [50] * 8
    assert all(len(np.unique(LABELS[p])) >= 5 for p in parts)


def test_shards_two_labels_per_client():
    parts = partition("shards", LABELS, 10, seed=0, task=0)  # 20 shards of 20 = half a class each
    assert [len(p) for p in parts] == [40] * 10
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)
    parts3 = partition("shards", LABELS, 5, seed=0, task=0, shards_per_client=4)
    assert all(len(np.unique(LABELS[p])) <= 4 for p in parts3)


def test_dirichlet_small_alpha_skews_labels():
    skewed = partition("dirichlet", LABELS, 10, seed=0, task=0, alpha=0.05)
    flat = partition("dirichlet", LABELS, 10, seed=0, task=0, alpha=1000.0)
    def dominant(parts):
        return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])
    assert dominant(skewed) > 0.6 > 0.25 > dominant(flat)


def test_quantity_skews_sizes_not_labels():
    parts = partition("quantity", LABELS, 10, seed=0, task=0, beta=0.1)
    sizes = sorted(len(p) for p in parts)
    assert sum(sizes) == 400 and sizes[-1] > 3 * sizes[0]
    big = max(parts, key=len)
    assert len(np.unique(LABELS[big])) == 10


def test_too_many_clients_refused():
    with pytest.raises(ConfigError, match="num_clients"):
        partition("iid", LABELS[:5], 10, seed=0, task=0)
