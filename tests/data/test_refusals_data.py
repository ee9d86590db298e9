"""Every damaged or invalid data file makes ``cfl run`` exit with code 2 and a message naming the file.

Each case writes a small dataset in its real on-disk format (tests/fake_data.py), spoils one file, and runs
the CLI on it: no traceback, exit 2, the file's path and the way to get correct files in the message.
"""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import cfl
from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.data.cache import cache_key
from cfl.data.files import find_one
from cfl.data.idx import read_idx
from cfl.data.mnist_like import IDX_FILES
from cfl.data.request import StreamRequest
from cfl.data.stream import Stream
from cfl.data.stream_registry import STREAMS
from cfl.streams import registered
from tests import fake_data
from tests.conftest import make_stream


def _corrupt_gzip(root: Path) -> Path:
    fake_data.write_idx_dataset(root / "mnist")
    path = root / "mnist" / "train-images-idx3-ubyte.gz"
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the deflate stream: zlib.error, not a gzip header error
    path.write_bytes(bytes(data))
    return path


def _idx_rewrite(folder: str, name: str, array: np.ndarray) -> Callable[[Path], Path]:
    def spoil(root: Path) -> Path:
        fake_data.write_idx_dataset(root / folder)
        path = root / folder / name
        fake_data.write_idx(path, array, gz=True)
        return path
    return spoil


def _fmnist_six_classes(root: Path) -> Path:
    """Labels all in range, but classes 6..9 absent from the test file: tasks 3 and 4 would be empty."""
    _idx_rewrite("fashion-mnist", "t10k-labels-idx1-ubyte.gz", np.arange(20) % 6)(root)
    return root / "fashion-mnist"


def _pickle_instead(sub: str, name: str, obj: object, write: Callable[[Path], object]) -> Callable[[Path], Path]:
    def spoil(root: Path) -> Path:
        write(root)
        path = root / sub / name
        with open(path, "wb") as fh:
            pickle.dump(obj, fh)
        return path
    return spoil


MARKER = "PWNED"  # what a crafted pickle's payload would create in the data root


class _Payload:
    """Unpickled by plain ``pickle.load``, it creates ``marker``: with ``os.system`` (a shell command) or
    ``builtins.open``, as a crafted data file would run its code."""

    def __init__(self, marker: Path, shell: bool) -> None:
        self.marker, self.shell = marker, shell

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch '{self.marker}'",)) if self.shell else (open, (str(self.marker), "w"))


def _payload(sub: str, name: str, write: Callable[[Path], object], shell: bool,
             wrap: Callable[[_Payload], object]) -> Callable[[Path], Path]:
    """The dataset in its real layout, with ``sub/name`` a pickle of the expected keys holding a payload."""
    def spoil(root: Path) -> Path:
        write(root)
        path = root / sub / name
        with open(path, "wb") as fh:
            pickle.dump(wrap(_Payload(root / MARKER, shell)), fh)
        return path
    return spoil


def _cifar_rows(width: int) -> Callable[[Path], Path]:
    def spoil(root: Path) -> Path:
        fake_data.write_cifar100(root)
        path = root / "cifar-100-python" / "test"
        with open(path, "wb") as fh:
            pickle.dump({b"data": np.zeros((100, width), np.uint8), b"fine_labels": list(range(100))}, fh)
        return path
    return spoil


def _five_datasets(root: Path) -> None:
    fake_data.write_cifar10(root)
    fake_data.write_idx_dataset(root / "mnist")
    fake_data.write_svhn(root)
    fake_data.write_idx_dataset(root / "fashion-mnist")
    fake_data.write_notmnist(root)


def _cifar10_label(root: Path) -> Path:
    _five_datasets(root)
    path = root / "cifar-10-batches-py" / "data_batch_2"
    with open(path, "wb") as fh:
        pickle.dump({b"data": np.zeros((20, 3072), np.uint8), b"labels": [10] * 20}, fh)
    return path


def _mini_too_few(root: Path) -> Path:
    fake_data.write_mini_imagenet(root, classes=6, per_class=6)
    return root / "mini-imagenet" / "mini-imagenet-cache-train.pkl"


def _mini_image_size(root: Path) -> Path:
    fake_data.write_mini_imagenet(root, classes=10, per_class=6)
    path = root / "mini-imagenet" / "mini-imagenet-cache-val.pkl"
    with open(path, "wb") as fh:
        pickle.dump({"image_data": np.zeros((18, 32, 32, 3), np.uint8),
                     "class_dict": {"n1": list(range(6)), "n2": list(range(6, 12)), "n3": list(range(12, 18))}}, fh)
    return path


def _svhn_label(root: Path) -> Path:
    from scipy.io import savemat

    _five_datasets(root)
    path = root / "svhn" / "test_32x32.mat"
    savemat(str(path), {"X": np.zeros((32, 32, 3, 4), np.uint8), "y": np.array([[1], [2], [0], [11]], np.uint8)})
    return path


def _plain_gzip_garbage(root: Path) -> Path:
    fake_data.write_idx_dataset(root / "mnist")
    path = root / "mnist" / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x14" + bytes(range(20))))
    return path  # labels 0..19: out of range for 10 classes


def _idx_label_in_the_cache_too(root: Path) -> Path:
    """Labels 10 in the file and in a tensor cache keyed to the files (as a foreign writer would leave it): the
    cache is checked like the file, rebuilt, and the reader refuses the file."""
    path = _idx_rewrite("mnist", "train-labels-idx1-ubyte.gz", np.full(60, 10))(root)
    sources = {k: find_one(root / "mnist", names) for k, names in IDX_FILES.items()}
    tensors = {k: read_idx(f) if k.endswith("_x") else read_idx(f).long() for k, f in sources.items()}
    (root / "cache").mkdir()
    torch.save(tensors, root / "cache" / f"mnist-{cache_key('mnist', sources.values())}.pt")
    return path


MINI = "mini-imagenet"
# (case, stream, num_tasks, writer of a data root returning the spoiled file, words the message must contain)
CASES = [
    ("corrupted .gz (zlib.error)", "permuted-mnist", 1, _corrupt_gzip, ["MNIST"]),
    ("IDX images 27x27", "permuted-mnist", 1,
     _idx_rewrite("mnist", "train-images-idx3-ubyte.gz", np.zeros((60, 27, 27), np.uint8)), ["28, 28"]),
    ("IDX images fewer than labels", "permuted-mnist", 1,
     _idx_rewrite("mnist", "train-images-idx3-ubyte.gz", np.zeros((59, 28, 28), np.uint8)), ["59", "60"]),
    ("IDX labels out of range (permuted)", "permuted-mnist", 1,
     _idx_rewrite("mnist", "train-labels-idx1-ubyte.gz", np.full(60, 10)), ["0..9"]),
    ("IDX labels out of range (split)", "split-fmnist", 2,
     _idx_rewrite("fashion-mnist", "train-labels-idx1-ubyte.gz", np.arange(60) % 12), ["0..9"]),
    ("IDX labels out of range, test file", "permuted-mnist", 1, _plain_gzip_garbage, ["0..9"]),
    ("IDX labels out of range, also in the tensor cache", "permuted-mnist", 1, _idx_label_in_the_cache_too,
     ["0..9"]),
    ("IDX labels lack the classes of a task", "split-fmnist", 5, _fmnist_six_classes, ["task 3", "Lower"]),
    ("CIFAR-100 pickle is a list", "split-cifar100", 2,
     _pickle_instead("cifar-100-python", "train", [1, 2, 3], fake_data.write_cifar100), ["list"]),
    ("CIFAR-100 pickle without labels", "split-cifar100", 2,
     _pickle_instead("cifar-100-python", "train", {b"data": np.zeros((2, 3072), np.uint8)}, fake_data.write_cifar100),
     ["fine_labels"]),
    ("CIFAR-100 rows not 3072 bytes", "split-cifar100", 2, _cifar_rows(1000), ["3072"]),
    ("CIFAR-10 label out of range", "five-datasets", 1, _cifar10_label, ["0..9"]),
    ("Mini-ImageNet pickle is a list", MINI, 2,
     _pickle_instead(MINI, "mini-imagenet-cache-test.pkl", [0], lambda r: fake_data.write_mini_imagenet(r)),
     ["list"]),
    ("Mini-ImageNet too few classes", MINI, 2, _mini_too_few, ["6 classes", "10"]),
    ("Mini-ImageNet images not 84x84", MINI, 2, _mini_image_size, ["84, 84, 3"]),
    ("SVHN label out of range", "five-datasets", 3, _svhn_label, ["1..10"]),
    ("CIFAR-100 pickle running builtins.open", "split-cifar100", 2,
     _payload("cifar-100-python", "train", fake_data.write_cifar100, False,
              lambda p: {b"data": p, b"fine_labels": list(range(100))}), ["refused: the pickle calls io.open"]),
    ("CIFAR-10 pickle running os.system", "five-datasets", 1,
     _payload("cifar-10-batches-py", "data_batch_1", _five_datasets, True,
              lambda p: {b"data": np.zeros((20, 3072), np.uint8), b"labels": [p]}),
     ["refused: the pickle calls posix.system", "not a genuine dataset file"]),
    ("Mini-ImageNet pickle running os.system", MINI, 2,
     _payload(MINI, "mini-imagenet-cache-val.pkl", lambda r: fake_data.write_mini_imagenet(r), True,
              lambda p: {"image_data": np.zeros((12, 84, 84, 3), np.uint8), "class_dict": {"n1": p}}),
     ["refused: the pickle calls posix.system"]),
]


def test_the_table_covers_every_reader():
    streams = {c[1] for c in CASES}
    assert {"permuted-mnist", "split-fmnist", "split-cifar100", "five-datasets", MINI} <= streams
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("stream", "num_tasks", "spoil", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_data_refusal(tmp_path, capsys, stream, num_tasks, spoil, words):
    root = tmp_path / "data"
    root.mkdir()
    bad = spoil(root)
    config = {"stream": {"name": stream, "num_tasks": num_tasks}, "data_root": str(root), "num_clients": 2,
              "clients_per_round": 1, "rounds_per_task": 1, "batch_size": 4, "threads": 1,
              "wandb": {"mode": "disabled"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    code = main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert not (root / MARKER).exists(), err  # no code of a data file ran
    assert code == 2, err
    assert err.startswith("cfl: config error: "), err
    for word in [str(bad), *words]:
        assert word in err, (word, err)
    assert "To get them" in err or "lack these classes" in err, err  # the fix
    assert not (tmp_path / "run").exists()  # a run that failed before its first round leaves nothing


# ---- resuming on other data (the checkpoint's data fingerprint) ----
def _finished_run(tmp_path: Path) -> tuple[Path, Path]:
    """A finished 2-task permuted-mnist run on generated files in ``tmp_path/a``; returns (data root, run)."""
    root = tmp_path / "a"
    fake_data.write_idx_dataset(root / "mnist")
    config = {"stream": {"name": "permuted-mnist", "num_tasks": 2}, "data_root": str(root), "num_clients": 2,
              "clients_per_round": 1, "rounds_per_task": 1, "batch_size": 4, "threads": 1,
              "wandb": {"mode": "disabled"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    return root, tmp_path / "run"


def test_resume_on_other_data_is_refused(tmp_path, capsys):
    root, run = _finished_run(tmp_path)
    other = tmp_path / "b"
    fake_data.write_idx_dataset(other / "mnist", n_train=50)  # other data: 50 training images instead of 60
    before = {p: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".cfl.lock"}
    capsys.readouterr()
    code = main(["run", "--resume", str(run), "--set", f"data_root={other}", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    for word in ["not the data this run was trained on", "task 0: 'perm-mnist-0', 60 train / 20 test samples",
                 "50 train / 20 test samples", f"data_root: '{root}'", f"'{other}'", "--out"]:
        assert word in err, (word, err)
    assert {p: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".cfl.lock"} == before


def test_resume_on_a_replaced_file_of_the_same_size_is_refused(tmp_path, capsys):
    root, run = _finished_run(tmp_path)
    labels = root / "mnist" / "t10k-labels-idx1-ubyte.gz"
    fake_data.write_idx(labels, np.arange(20) % 3, gz=True)  # same sizes, other labels
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "task 0: 'perm-mnist-0', 60 train / 20 test samples, hash" in err and "task 1:" in err, err


def test_resume_on_a_copy_of_the_data_is_accepted(tmp_path, capsys):
    root, run = _finished_run(tmp_path)
    fake_data.write_idx_dataset(tmp_path / "copy" / "mnist")  # same content, another place, new mtimes
    assert main(["run", "--resume", str(run), "--set", f"data_root={tmp_path / 'copy'}", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_checkpoint_without_fingerprint_resumes_with_a_warning(tmp_path, capsys):
    import torch

    _, run = _finished_run(tmp_path)
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    del payload["data"]  # as written before checkpoints held a data fingerprint (or a checksum of their own)
    payload.pop("sha256", None)
    torch.save(payload, run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "holds no data fingerprint" in capsys.readouterr().err


# ---- streams from every source pass one check (cfl.data.stream_checks) before any run file is written ----
def _task(t: int, **tensors: Callable[[torch.Tensor], object]) -> Callable[[Stream], None]:
    """Replace tensors of task ``t`` (``train_x=lambda x: ...``) by a function of the old ones."""
    def spoil(stream: Stream) -> None:
        for key, change in tensors.items():
            setattr(stream.tasks[t], key, change(getattr(stream.tasks[t], key)))
    return spoil


def _set(value: float, at: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[at] = value
        return x
    return change


def _classes(t: int, classes: list[int]) -> Callable[[Stream], None]:
    return lambda stream: setattr(stream.tasks[t], "classes", classes)


TINY_RUN = {"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 8, "threads": 1,
            "wandb": {"mode": "disabled"}}
# (case, scenario, spoiler of a 2-task blobs stream (3 classes a task, 60 train / 30 test samples of 12 inputs),
#  words of the message besides "stream 'blobs', task T")
STREAM_CASES = [
    ("integer inputs", "task", 0, _task(0, train_x=lambda x: x.mul(50).clamp(0, 255).to(torch.uint8)),
     ["train_x holds integers (torch.uint8)", "x.float().div(255)"]),
    ("float64 inputs", "task", 1, _task(1, test_x=lambda x: x.double()), ["test_x is torch.float64", "x.float()"]),
    ("float16 inputs", "task", 0, _task(0, train_x=lambda x: x.half()), ["torch.float16", "x.float()"]),
    ("NaN input", "task", 1, _task(1, test_x=_set(float("nan"), (3, 4))), ["test_x holds 1 non-finite", "replace"]),
    ("inf input", "task", 0, _task(0, train_x=_set(float("inf"), (0, 0))), ["train_x holds 1 non-finite"]),
    ("float labels", "task", 0, _task(0, train_y=lambda y: y.float()), ["train_y holds floats", "y.long()"]),
    ("uint8 labels", "task", 0, _task(0, test_y=lambda y: y.to(torch.uint8)), ["test_y holds torch.uint8", "y.long()"]),
    ("numpy labels", "task", 0, _task(0, train_y=lambda y: y.numpy()), ["train_y is a ndarray, not a torch tensor"]),
    ("label beyond the head", "task", 0, _task(0, train_y=_set(3, (5,))),
     ["train_y holds labels 0..3, expected 0..2 (classes_per_head 3", "relabel"]),
    ("label beyond the head, test set", "task", 1, _task(1, test_y=_set(7, (0,))), ["test_y holds labels 0..7"]),
    ("negative label", "task", 0, _task(0, train_y=_set(-1, (2,))), ["train_y holds labels -1..2, expected 0..2"]),
    ("negative label, test set", "class", 1, _task(1, test_y=_set(-3, (2,))), ["test_y holds labels -3..5"]),
    ("fewer labels than inputs", "task", 0, _task(0, train_y=lambda y: y[:55]),
     ["train_y holds 55 labels for 60 inputs"]),
    ("more labels than inputs", "task", 1, _task(1, test_x=lambda x: x[:20]), ["test_y holds 30 labels for 20 inputs"]),
    ("labels not a vector", "task", 0, _task(0, train_y=lambda y: y.unsqueeze(1)), ["train_y has shape (60, 1)"]),
    ("inputs of another shape in a later task", "task", 1, _task(1, train_x=lambda x: x[:, :10]),
     ["train_x has shape (60, 10), expected (N, 12)"]),
    ("a task without test samples", "task", 1, _task(1, test_x=lambda x: x[:0], test_y=lambda y: y[:0]),
     ["test_x holds no samples"]),
    ("class-incremental label outside the classes seen", "class", 0, _task(0, train_y=_set(4, (1,))),
     ["train_y holds labels [4]", "Task.classes"]),
    ("class-incremental Task.classes beyond the head", "class", 1, _classes(1, [3, 4, 9]),
     ["Task.classes of task 'blob-1' holds [9]", "0..5"]),
]


def test_the_stream_table_is_complete():
    assert len({c[0] for c in STREAM_CASES}) == len(STREAM_CASES) >= 19


@pytest.mark.parametrize(("scenario", "task", "spoil", "words"), [c[1:] for c in STREAM_CASES],
                         ids=[c[0] for c in STREAM_CASES])
def test_a_bad_stream_object_is_refused_before_any_file(tmp_path, scenario, task, spoil, words):
    stream = make_stream(scenario, num_tasks=2)
    spoil(stream)
    with pytest.raises(ConfigError) as err:
        cfl.run(TINY_RUN, out=tmp_path / "run", stream=stream)
    for word in [f"stream 'blobs', task {task} ('blob-{task}'): ", *words]:
        assert word in str(err.value), (word, str(err.value))
    assert not (tmp_path / "run").exists() and "blobs" not in STREAMS


def test_a_registered_builders_bad_labels_exit_2_and_leave_no_run(tmp_path, capsys):
    """The registry route (plugins, built-in readers): checked in load_stream, after the data loads."""
    def build(request: StreamRequest) -> Stream:
        stream = make_stream("task", num_tasks=request.num_tasks)
        _task(1, train_y=_set(5, (0,)))(stream)
        return stream

    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**TINY_RUN, "stream": {"name": "bad-blobs"}}))
    with registered("bad-blobs", build, tasks=2, scenarios=("task",), input_shape=(12,), classes_per_task=3,
                    default_model="digits-mlp"):
        code = main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cfl: config error: stream 'blobs', task 1 ('blob-1'): train_y holds labels 0..5, expected 0..2" in err
    assert not (tmp_path / "run").exists()


def test_an_avalanche_benchmark_with_integer_inputs_exits_2_before_a_run_directory(tmp_path, capsys):
    config = {**TINY_RUN, "stream": {"name": "avalanche", "benchmark": "tests.avalanche_benchmarks.digits_uint8"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    for word in ["'stream.benchmark: tests.avalanche_benchmarks.digits_uint8': stream 'avalanche-digits_uint8', "
                 "task 0 ('exp-0'): train_x holds integers (torch.uint8)", "x.float().div(255)"]:
        assert word in err, err
    assert not (tmp_path / "run").exists()
