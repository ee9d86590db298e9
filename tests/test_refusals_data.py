"""Every damaged or invalid data file makes ``cfl run`` exit with code 2 and a message naming the file.

Each case writes a small dataset in its real on-disk format (tests/fake_data.py), spoils one file, and runs
the CLI on it: no traceback, exit 2, the file's path and the way to get correct files in the message.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from cfl.cli import main
from tests import fake_data


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
    del payload["data"]  # as written before checkpoints held a data fingerprint
    torch.save(payload, run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "holds no data fingerprint" in capsys.readouterr().err
