"""cfl.streams.from_avalanche / to_avalanche: Avalanche benchmarks in, cfl streams out (docs/streams.md)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from cfl.config.schema import ConfigError
from cfl.data.digits import load_digits_tensors
from cfl.data.stream_registry import STREAMS, StreamRequest
from cfl.engine.rounds.runner import Runner
from cfl.streams import from_avalanche, to_avalanche
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _dataset(x: torch.Tensor, y: torch.Tensor) -> TensorDataset:
    data = TensorDataset(x, y)
    data.targets = y.tolist()
    return data


def _digits_benchmark(**kw: object):
    from avalanche.benchmarks.scenarios.deprecated.generators import nc_benchmark

    (xtr, ytr), (xte, yte) = load_digits_tensors()
    kw = {"n_experiences": 5, "task_labels": True, "shuffle": False, **kw}
    return nc_benchmark(_dataset(xtr, ytr), _dataset(xte, yte), **kw)


def _fake(train: list[list], test: list[list] | None = None) -> SimpleNamespace:
    """A benchmark-shaped object whose experiences hold plain lists of samples."""
    def stream(exps: list[list]) -> list[SimpleNamespace]:
        return [SimpleNamespace(dataset=d, current_experience=i) for i, d in enumerate(exps)]
    return SimpleNamespace(train_stream=stream(train), test_stream=stream(test if test is not None else train))


def test_task_benchmark_converts_and_trains_through_the_engine():
    (xtr, ytr), _ = load_digits_tensors()
    stream = from_avalanche(_digits_benchmark(), name="digits-av")
    assert (stream.name, stream.scenario, stream.classes_per_head, stream.input_shape) == \
        ("digits-av", "task", 2, (1, 8, 8))
    assert [t.classes for t in stream.tasks] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert stream.info["avalanche_task_labels"] == [0, 1, 2, 3, 4]
    task = stream.tasks[1]  # digits 2 and 3 -> head outputs 0 and 1 (nc_benchmark groups samples by class)
    for head, digit in ((0, 2), (1, 3)):
        assert torch.allclose(task.train_x[task.train_y == head].sum(0), xtr[ytr == digit].sum(0), atol=1e-4)
    runner = Runner(tiny_config(num_clients=4, clients_per_round=2, rounds_per_task=1), stream)
    runner.run()
    assert all(acc is not None for acc in runner.progress.acc_matrix[-1])


def test_an_avalanche_benchmark_runs_end_to_end_through_the_python_api(tmp_path):
    import cfl

    stream = from_avalanche(_digits_benchmark(), name="digits-av")
    results = cfl.run({"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 16,
                       "wandb": {"mode": "disabled"}}, overrides={"stream.num_tasks": 3}, out=tmp_path / "r",
                      stream=stream)
    assert (results["stream"], results["complete"], len(results["acc_matrix"])) == ("digits-av", True, 3)
    assert all(acc is not None for acc in results["acc_matrix"][-1])
    assert (tmp_path / "r" / "results.json").is_file() and "digits-av" not in STREAMS  # lent for the call only


def test_shared_task_label_gives_class_scenario_with_global_labels():
    stream = from_avalanche(_digits_benchmark(task_labels=False))
    assert (stream.scenario, stream.classes_per_head) == ("class", 10)
    assert set(stream.tasks[2].train_y.tolist()) == {4, 5}
    assert stream.class_mask(1).tolist() == [True] * 4 + [False] * 6


def test_labels_from_zero_in_each_experience_keep_the_original_ids():
    stream = from_avalanche(_digits_benchmark(fixed_class_order=[3, 1, 0, 2, 4, 5, 6, 7, 8, 9],
                                              class_ids_from_zero_in_each_exp=True))
    (xtr, ytr), _ = load_digits_tensors()
    task = stream.tasks[0]
    assert task.classes == [3, 1]  # head output 0 is digit 3, output 1 is digit 1
    for head, digit in ((0, 3), (1, 1)):
        assert torch.allclose(task.train_x[task.train_y == head].sum(0), xtr[ytr == digit].sum(0), atol=1e-4)
    assert stream.info["original_class_ids"][:2] == [3, 1]


def test_experiences_are_read_with_the_eval_transforms():
    (xtr, ytr), _ = load_digits_tensors()
    stream = from_avalanche(_digits_benchmark(train_transform=lambda x: x + 100.0))
    assert torch.allclose(stream.tasks[0].train_x.sum(0), xtr[ytr <= 1].sum(0), atol=1e-4)  # no +100


def test_class_incremental_benchmark_of_the_new_api_converts():
    from avalanche.benchmarks.scenarios.supervised import class_incremental_benchmark
    from avalanche.benchmarks.utils import _make_taskaware_classification_dataset as avalanche_dataset

    (xtr, ytr), (xte, yte) = load_digits_tensors()
    datasets = {"train": avalanche_dataset(_dataset(xtr, ytr)), "test": avalanche_dataset(_dataset(xte, yte))}
    stream = from_avalanche(class_incremental_benchmark(datasets, num_experiences=5))
    assert (stream.scenario, stream.classes_per_head, stream.num_tasks) == ("class", 10, 5)
    assert sorted(c for t in stream.tasks for c in t.classes) == list(range(10))


def test_same_classes_everywhere_gives_domain_and_one_test_experience_serves_every_task():
    x = torch.arange(8.0).view(8, 1)
    y = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    samples = [(x[i], y[i], 0) for i in range(8)]
    stream = from_avalanche(_fake([samples[:4], samples[4:]], [samples[:2]]))
    assert (stream.scenario, stream.classes_per_head, stream.num_tasks) == ("domain", 2, 2)
    assert torch.equal(stream.tasks[1].train_x, x[4:]) and torch.equal(stream.tasks[1].test_x, x[:2])


class _Pil(Dataset):
    """Two 2x2 grayscale PIL images with pixel values 0 and 255, classes 0 and 1."""

    targets = [0, 1]

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.new("L", (2, 2), color=255 * i), i


def test_pil_images_become_tensors_in_0_1():
    from avalanche.benchmarks.scenarios.deprecated.generators import nc_benchmark

    stream = from_avalanche(nc_benchmark(_Pil(), _Pil(), 1, task_labels=False, shuffle=False))
    task = stream.tasks[0]
    assert stream.input_shape == (1, 2, 2)
    assert task.train_x.tolist() == [[[[0.0, 0.0], [0.0, 0.0]]], [[[1.0, 1.0], [1.0, 1.0]]]]
    assert task.train_y.tolist() == [0, 1]


@pytest.mark.parametrize(("train", "test", "message"), [
    ([[(torch.zeros(2), 0.5)]], None, "target is a float (regression?)"),
    ([[(torch.zeros(2), {"boxes": torch.zeros(1, 4)})]], None, "a dict (detection?)"),
    ([[("text", 0)]], None, "input is a str, not a tensor or PIL image"),
    ([[(torch.zeros(2), 0, 0), (torch.zeros(2), 1, 1)]], None, "mixes task labels [0, 1]"),
    ([[(torch.zeros(2), 0, 0)], [(torch.zeros(2), 1, 0)], [(torch.zeros(2), 2, 1)]], None,
     "task labels [0, 0, 1] repeat but are not all equal"),
    ([[(torch.zeros(2), 0, 0)], [(torch.zeros(2), 1, 1)]], [[(torch.zeros(2), 0, 0)], [(torch.zeros(2), 0, 1)]],
     "test experience 1 holds classes [0] that its training experience lacks"),
    ([[(torch.zeros(2), 0, 0)], [(torch.zeros(2), 1, 1)]], [[(torch.zeros(2), 0, 0)]],
     "2 training and 1 test experiences"),
    ([[(torch.zeros(2), 0)], [(torch.zeros(3), 1)]], None, "different shapes [(2,), (3,)]"),
])
def test_unsupported_benchmarks_are_refused_with_what_is_supported(train, test, message):
    with pytest.raises(ConfigError) as err:
        from_avalanche(_fake(train, test))
    assert message in str(err.value)


def test_online_streams_and_non_benchmarks_are_refused():
    from avalanche.benchmarks.scenarios.online import split_online_stream

    online = split_online_stream(_digits_benchmark().train_stream, experience_size=100)
    with pytest.raises(ConfigError, match="online stream.*supports classification benchmarks"):
        from_avalanche(SimpleNamespace(train_stream=online, test_stream=[]))
    with pytest.raises(ConfigError, match="list has no train_stream"):
        from_avalanche([])


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_split_digits_round_trips_through_avalanche(scenario):
    stream = STREAMS["split-digits"].build(StreamRequest(5, scenario, 0, Path("."), False))
    benchmark = to_avalanche(stream)
    exp = benchmark.train_stream[3]
    assert exp.task_label == (3 if scenario == "task" else 0)
    assert sorted(exp.dataset.targets.uniques) == [6, 7]  # global class ids in either scenario
    back = from_avalanche(benchmark)
    assert (back.scenario, back.classes_per_head, back.input_shape) == \
        (scenario, stream.classes_per_head, stream.input_shape)
    for a, b in zip(stream.tasks, back.tasks, strict=True):
        assert a.classes == b.classes
        for key in ("train_x", "train_y", "test_x", "test_y"):
            assert torch.equal(getattr(a, key), getattr(b, key)), key


def test_docs_examples_run():
    page = (ROOT / "docs" / "streams.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "split-mnist.yaml" not in b]
    assert len(blocks) == 2  # the config route's example: tests/data/test_avalanche_route.py
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Avalanche warns that the example's strategy has no loggers
        for block in blocks:
            exec(compile(block, "docs/streams.md", "exec"), {})


def test_importing_cfl_streams_does_not_import_avalanche():
    import os
    import subprocess
    import sys

    code = "import sys, cfl.streams; print('avalanche' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
