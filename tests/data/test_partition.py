import numpy as np
import pytest

from cfl.config.schema import ConfigError
from cfl.data.partition import partition

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


def loop_dirichlet(labels, num_clients, rng, alpha=0.5, min_samples=1):
    """The per-client loop the vectorised ``dirichlet`` replaced (Hsu et al. 2019 as first written): the oracle."""
    for _attempt in range(1000):
        buckets = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha))) * len(idx)).astype(int)[:-1]
            for k, part in enumerate(np.split(idx, cuts)):
                buckets[k].append(part)
        parts = [np.sort(np.concatenate(b)) for b in buckets]
        if min(len(p) for p in parts) >= min_samples:
            return parts
    raise AssertionError("the oracle found no split")


RAGGED = np.random.default_rng(5).integers(0, 10, 1000)


@pytest.mark.parametrize(("labels", "clients", "alpha", "min_samples"), [
    (LABELS, 10, 0.5, 1), (RAGGED, 50, 0.1, 1), (RAGGED[:333] % 7, 30, 1.0, 3),
    (LABELS, 10, 0.05, 10),  # needs several draws: the redraws must consume the generator identically
    (np.repeat(np.arange(3), 20), 3, 1000.0, 5), (np.repeat(np.arange(10), 600), 300, 0.5, 1)])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_dirichlet_splits_exactly_as_the_per_client_loop(labels, clients, alpha, min_samples, seed):
    from cfl.data.partition import dirichlet

    want = loop_dirichlet(labels, clients, np.random.default_rng(seed), alpha, min_samples)
    got = dirichlet(labels, clients, np.random.default_rng(seed), alpha=alpha, min_samples=min_samples)
    assert len(got) == len(want)
    assert all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want, strict=True))


def test_impossible_dirichlet_is_refused_with_the_fix():
    labels = np.repeat(np.arange(10), 60)  # 600 samples, 0.3 per class per client
    with pytest.raises(ConfigError, match="quantity"):
        partition("dirichlet", labels, 200, seed=0, task=0, alpha=100.0, min_samples=2)


TEN_K = 10_000
LABELS_10K = np.random.default_rng(1).integers(0, 10, 3 * TEN_K)  # 3 samples per client on average


@pytest.mark.parametrize(("name", "params"), [("iid", {}), ("shards", {"shards_per_client": 1}),
                                              ("dirichlet", {"alpha": 1000.0, "min_samples": 0}),
                                              ("quantity", {"beta": 0.5})])
def test_ten_thousand_clients_few_samples_ragged(name, params):
    parts = partition(name, LABELS_10K, TEN_K, seed=2, task=0, **params)
    assert len(parts) == TEN_K
    allidx = _check_disjoint_cover(parts)
    assert len(allidx) == len(LABELS_10K)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # each client's rows sorted
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= (1 if name != "dirichlet" else 0)
    if name == "quantity":
        assert sizes.max() > 5 * sizes.mean()  # ragged


def test_ten_thousand_clients_sampling_and_schedule():
    import torch

    from cfl.engine.rounds.round_draws import Schedule, sample_clients
    from cfl.schedules import build_plan
    from cfl.validation import from_dict
    from tests.conftest import make_stream

    rounds = [sample_clients(0, 0, r, TEN_K, 20) for r in range(50)]
    assert all(len(set(c)) == 20 and c == sorted(c) and 0 <= c[0] and c[-1] < TEN_K for c in rounds)
    assert len({c for r in rounds for c in r}) > 900  # 1000 draws spread over the clients
    stream = make_stream(n_train=2 * TEN_K + 123, n_test=10)
    cfg = from_dict({"num_clients": TEN_K, "clients_per_round": 20, "partition": {"name": "quantity", "beta": 0.3},
                     "model": {"name": "digits-mlp"}, "wandb": {"mode": "disabled"}})
    jobs = Schedule(cfg, stream, build_plan(cfg, stream.num_tasks), torch.device("cpu")).round_jobs(1, 3)
    assert [j.cid for j in jobs] == sample_clients(0, 1, 3, TEN_K, 20)
    assert all(len(j.indices) >= 1 for j in jobs)


def test_ten_thousand_clients_run_and_evaluate():
    from cfl.engine.rounds.runner import Runner
    from cfl.validation import from_dict
    from tests.conftest import make_stream

    stream = make_stream(n_train=2 * TEN_K, n_test=300)
    cfg = from_dict({"num_clients": TEN_K, "clients_per_round": 20, "rounds_per_task": 2, "batch_size": 4,
                     "lr": 0.1, "partition": {"name": "quantity", "beta": 0.5}, "model": {"name": "digits-mlp"},
                     "wandb": {"mode": "disabled"}})
    runner = Runner(cfg, stream)
    progress = runner.run()
    assert progress.global_round == 4
    assert all(0.0 <= a <= 100.0 for row in progress.acc_matrix for a in row if a is not None)
    assert progress.acc_matrix[1][0] is not None and progress.acc_matrix[1][1] > 34.0  # 3 classes: above chance


def test_impossible_dirichlet_is_refused_before_any_round():
    from cfl.engine.rounds.runner import Runner
    from cfl.validation import from_dict
    from tests.conftest import make_stream

    cfg = from_dict({"num_clients": 50, "clients_per_round": 5, "partition": {"name": "dirichlet", "alpha": 0.01,
                     "min_samples": 2}, "model": {"name": "digits-mlp"}, "wandb": {"mode": "disabled"}})
    with pytest.raises(ConfigError, match="none of 1000 draws"):
        Runner(cfg, make_stream(n_train=120))


# ---- classes: GLFC's protocol (each client draws k of the task's classes) ----
def test_classes_with_overlap_gives_each_client_every_sample_of_k_classes():
    parts = partition("classes", LABELS, 12, seed=0, task=0, classes_per_client=6, overlap=True)
    assert len(parts) == 12
    for p in parts:
        held = np.unique(LABELS[p])
        assert len(held) == 6 and np.array_equal(p, np.flatnonzero(np.isin(LABELS, held)))  # 40 samples each
    assert len(np.concatenate(parts)) == 12 * 6 * 40 > len(LABELS)  # clients share samples
    again = partition("classes", LABELS, 12, seed=0, task=0, classes_per_client=6, overlap=True)
    other = partition("classes", LABELS, 12, seed=0, task=1, classes_per_client=6, overlap=True)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_classes_without_overlap_splits_each_class_between_its_holders():
    parts = partition("classes", LABELS, 12, seed=0, task=0, classes_per_client=6, overlap=False)
    allidx = _check_disjoint_cover(parts)
    drawn = [set(np.unique(LABELS[p]).tolist()) for p in parts]
    assert all(len(d) == 6 for d in drawn)
    for c in range(10):  # class c's 40 samples cut into equal chunks, one per client that drew it
        holders = [i for i, d in enumerate(drawn) if c in d]
        sizes = sorted(int((LABELS[parts[i]] == c).sum()) for i in holders)
        assert sum(sizes) == (40 if holders else 0) and sizes[-1] - sizes[0] <= 1
    assert len(allidx) == sum(40 for c in range(10) if any(c in d for d in drawn))


def test_classes_every_class_drawn_by_every_client_is_an_equal_split_without_overlap():
    """k = all 10 classes: with overlap each of 4 clients holds all 400 samples; without, 10 of each class."""
    shared = partition("classes", LABELS, 4, seed=1, task=0, classes_per_client=10, overlap=True)
    assert all(np.array_equal(p, np.arange(400)) for p in shared)
    split = partition("classes", LABELS, 4, seed=1, task=0, classes_per_client=10, overlap=False)
    assert all(np.array_equal(np.bincount(LABELS[p], minlength=10), [10] * 10) for p in split)


def test_classes_refusals_name_the_fix():
    with pytest.raises(ConfigError, match="lower partition.classes_per_client"):
        partition("classes", LABELS, 4, seed=0, task=0, classes_per_client=11, overlap=True)
    few = np.repeat(np.arange(2), 3)  # 3 samples per class, 5 clients each drawing both classes
    with pytest.raises(ConfigError, match="overlap: true"):
        partition("classes", few, 5, seed=0, task=0, classes_per_client=2, overlap=False)
    assert len(partition("classes", few, 5, seed=0, task=0, classes_per_client=2, overlap=True)) == 5
