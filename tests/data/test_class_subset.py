"""``stream.train_per_class`` / ``test_per_class``: a seeded, class-balanced subset of every task's samples
(cfl/data/class_subset.py), refused where it cannot be balanced or would keep everything, recorded in results.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cfl
from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.data.class_subset import balanced_indices, subset_per_class
from cfl.data.load import load_stream
from cfl.data.stream import Stream, Task
from cfl.validation import from_dict


def two_task_stream() -> Stream:
    """Task a: train labels 0,0,0,1,1,1,1 (3 of class 0, 4 of class 1); task b: 2,3,3,2,2,3; tests alike."""
    def task(name: str, y: list[int], classes: list[int]) -> Task:
        y_t = torch.tensor(y)
        x = torch.arange(len(y), dtype=torch.float32).view(-1, 1)  # x = the sample's index: shows what was kept
        return Task(name, x, y_t, x.clone(), y_t.clone(), classes)

    return Stream("toy", "class", [task("a", [0, 0, 0, 1, 1, 1, 1], [0, 1]), task("b", [2, 3, 3, 2, 2, 3], [2, 3])],
                  4, (1,), "mlp")


def test_each_class_keeps_its_count_in_the_original_order_and_the_draw_is_seeded():
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    kept = balanced_indices(y, 2, np.random.default_rng([0, 0, 0]))
    assert torch.equal(y[kept].bincount(), torch.tensor([2, 2]))
    assert torch.equal(kept, kept.sort().values)  # the samples' order kept
    again = balanced_indices(y, 2, np.random.default_rng([0, 0, 0]))
    assert torch.equal(kept, again)
    draws = {tuple(balanced_indices(y, 2, np.random.default_rng([s, 0, 0])).tolist()) for s in range(10)}
    assert len(draws) > 1  # another seed, another subset


def test_the_subset_cuts_train_and_test_of_every_task_and_keeps_inputs_with_their_labels():
    stream = two_task_stream()
    subset_per_class(stream, 2, 1, seed=0)
    a, b = stream.tasks
    assert a.train_y.bincount().tolist() == [2, 2] and b.train_y.bincount().tolist() == [0, 0, 2, 2]
    assert a.test_y.bincount().tolist() == [1, 1] and b.test_y.bincount().tolist() == [0, 0, 1, 1]
    full = two_task_stream()
    for task, whole in zip(stream.tasks, full.tasks, strict=True):  # each kept input is still its own label's
        assert torch.equal(whole.train_y[task.train_x.view(-1).long()], task.train_y)
        assert torch.equal(whole.test_y[task.test_x.view(-1).long()], task.test_y)


def test_only_the_split_given_is_cut():
    stream = two_task_stream()
    subset_per_class(stream, None, 2, seed=0)
    assert len(stream.tasks[0].train_y) == 7 and len(stream.tasks[0].test_y) == 4


@pytest.mark.parametrize(("train", "test", "message"), [
    (4, None, "stream.train_per_class 4 on stream 'toy': task 'a' has only 3 train samples of class 0, fewer than 4: "
              "the subset could not be class-balanced; give at most 3"),
    (None, 5, "stream.test_per_class 5 on stream 'toy': task 'a' has only 3 test samples of class 0, fewer than 5"),
])
def test_a_count_above_a_class_is_refused_naming_the_task_and_class(train, test, message):
    stream = two_task_stream()
    with pytest.raises(ConfigError) as err:
        subset_per_class(stream, train, test, seed=0)
    assert message in str(err.value)
    assert len(stream.tasks[0].train_y) == 7  # nothing cut


def test_a_count_that_keeps_everything_is_refused():
    stream = Stream("even", "class", [Task("a", torch.zeros(4, 1), torch.tensor([0, 0, 1, 1]), torch.zeros(2, 1),
                                           torch.tensor([0, 1]), [0, 1])], 2, (1,), "mlp")
    with pytest.raises(ConfigError, match=r"stream.train_per_class 2 .* keeps them all; remove the key"):
        subset_per_class(stream, 2, None, seed=0)


def test_split_digits_through_the_config_is_balanced_and_fingerprinted_apart():
    def stream(**keys):
        cfg = from_dict({"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class", **keys}})
        return load_stream(**cfg.stream_fields())

    cut = stream(train_per_class=5, test_per_class=3)
    assert [t.train_y.bincount().tolist() for t in cut.tasks] == [[5, 5], [0, 0, 5, 5]]
    assert [len(t.test_y) for t in cut.tasks] == [6, 6]
    assert cut.info["fingerprint"] != stream().info["fingerprint"]
    assert cut.info["fingerprint"] == stream(train_per_class=5, test_per_class=3).info["fingerprint"]


def test_a_run_records_the_subset_and_a_bad_count_is_exit_2_before_any_file(tmp_path, capsys):
    tiny = {"stream": {"name": "split-digits", "num_tasks": 2, "train_per_class": 8, "test_per_class": 4},
            "num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 8,
            "wandb": {"mode": "disabled"}}
    results = cfl.run(tiny, out=tmp_path / "r")
    assert results["config"]["stream"]["train_per_class"] == 8 and results["config"]["stream"]["test_per_class"] == 4
    assert json.loads((tmp_path / "r" / "results.json").read_text())["config"]["stream"]["train_per_class"] == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("stream: {name: split-digits, num_tasks: 2, train_per_class: 1000}\nwandb: {mode: disabled}\n")
    assert main(["run", str(bad), "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "fewer than 1000" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
