"""Small dataset files in the real on-disk formats, with class-dependent content (image brightness and
a bright square whose position encodes the label), so a model can learn them and a label mix-up shows."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np


def class_images(labels: np.ndarray, h: int, w: int, channels: int = 0, seed: int = 0) -> np.ndarray:
    """uint8 images (N, h, w) or (N, h, w, channels): brightness 20 * label plus a square at column 2 * label."""
    rng = np.random.default_rng(seed)
    shape = (len(labels), h, w) + ((channels,) if channels else ())
    x = rng.integers(0, 10, size=shape).astype(np.int64)
    for i, c in enumerate(labels):
        x[i] += 20 * int(c) % 200
        x[i, 1:4, (2 * int(c)) % (w - 3):(2 * int(c)) % (w - 3) + 3] = 250
    return np.clip(x, 0, 255).astype(np.uint8)


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}i", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def write_idx_dataset(folder: Path, n_train: int = 60, n_test: int = 20, gz: bool = True) -> dict[str, np.ndarray]:
    """The four MNIST-style files (28x28, 10 classes cycled); returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    arrays = {}
    for split, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        y = (np.arange(n) * 7) % 10
        x = class_images(y, 28, 28, seed=seed)
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", x, gz)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", y, gz)
        arrays[f"{split}_x"], arrays[f"{split}_y"] = x, y
    return arrays


def _cifar_rows(y: np.ndarray, seed: int) -> np.ndarray:
    return class_images(y, 32, 32, channels=3, seed=seed).transpose(0, 3, 1, 2).reshape(len(y), -1)


def write_cifar10(root: Path, per_batch: int = 20) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        y = (np.arange(per_batch) + i) % 10
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": _cifar_rows(y, i), b"labels": y.tolist(), b"batch_label": name.encode()}, fh)


def write_cifar100(root: Path, per_class_train: int = 2, per_class_test: int = 1, str_keys: bool = False) -> None:
    """``train``, ``test`` and ``meta`` pickles; ``str_keys``: keys as Python 3 reads the real files with
    ``encoding="latin1"`` (torchvision's reader needs them), else as bytes (``encoding="bytes"``)."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    key = str if str_keys else str.encode
    for name, per_class, seed in (("train", per_class_train, 0), ("test", per_class_test, 1)):
        y = np.repeat(np.arange(100), per_class)[::-1].copy()
        with open(folder / name, "wb") as fh:
            batch = {key("data"): _cifar_rows(y, seed), key("fine_labels"): y.tolist(),
                     key("coarse_labels"): (y // 5).tolist()}
            pickle.dump(batch, fh)
    with open(folder / "meta", "wb") as fh:
        pickle.dump({key("fine_label_names"): [f"class-{c}" for c in range(100)],
                     key("coarse_label_names"): [f"superclass-{c}" for c in range(20)]}, fh)


def write_svhn(root: Path, n_train: int = 30, n_test: int = 20) -> None:
    from scipy.io import savemat

    folder = root / "svhn"
    folder.mkdir(parents=True)
    for name, n, seed in (("train_32x32.mat", n_train, 0), ("test_32x32.mat", n_test, 1)):
        digits = np.arange(n) % 10
        x = class_images(digits, 32, 32, channels=3, seed=seed).transpose(1, 2, 3, 0)  # (32, 32, 3, N)
        savemat(str(folder / name), {"X": x, "y": np.where(digits == 0, 10, digits).reshape(-1, 1).astype(np.uint8)})


def write_notmnist(root: Path, per_letter: int = 6) -> None:
    from PIL import Image

    for label, letter in enumerate("ABCDEFGHIJ"):
        folder = root / "notMNIST_small" / letter
        folder.mkdir(parents=True)
        images = class_images(np.full(per_letter, label), 28, 28, seed=label)
        for i, img in enumerate(images):
            Image.fromarray(img, mode="L").save(folder / f"img{i:03d}.png")
        (folder / "broken.png").write_bytes(b"")  # the public archive holds empty files too


def write_mini_imagenet(root: Path, classes: int = 10, per_class: int = 6) -> list[str]:
    """Three pickles sharing ``classes`` wnids between them; returns the wnids in the order written."""
    folder = root / "mini-imagenet"
    folder.mkdir(parents=True)
    wnids = [f"n{9000000 - 7 * c:08d}" for c in range(classes)]  # not written in sorted order
    chunks = np.array_split(np.arange(classes), 3)
    for split, ids in zip(("train", "val", "test"), chunks, strict=True):
        labels = np.repeat(ids, per_class)
        images = class_images(labels, 84, 84, channels=3, seed=len(ids))
        class_dict = {wnids[c]: list(range(k * per_class, (k + 1) * per_class)) for k, c in enumerate(ids)}
        with open(folder / f"mini-imagenet-cache-{split}.pkl", "wb") as fh:
            pickle.dump({"image_data": images, "class_dict": class_dict}, fh)
    return wnids


def write_image(path: Path, value: int, size: tuple[int, int] = (12, 8)) -> None:
    """A plain image of grey level ``value`` (JPEG or PNG by the suffix)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, dtype=np.uint8)).save(path)


def write_imagenet_r(root: Path, classes: int = 20, per_class: int = 5) -> list[str]:
    wnids = [f"n{9000000 - 7 * c:08d}" for c in range(classes)]  # file order is not label order
    for wnid in wnids:
        for i in range(per_class):
            level = 6 * (sorted(wnids).index(wnid) + 1)  # a grey level per class, up to 42 classes
            write_image(root / "imagenet-r" / wnid / f"art_{i}.jpg", level)
    return wnids


def write_cub(root: Path, classes: int = 20, per_class: int = 4) -> None:
    folder = root / "CUB_200_2011"
    images, labels, split = [], [], []
    for c in range(classes):
        for i in range(per_class):
            image_id = c * per_class + i + 1
            rel = f"{c + 1:03d}.Bird_{c}/Bird_{c}_{i}.jpg"
            write_image(folder / "images" / rel, (6 * c + 5) % 256)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {c + 1}")
            split.append(f"{image_id} {int(i % 2 == 0)}")
    for name, lines in (("images.txt", images), ("image_class_labels.txt", labels), ("train_test_split.txt", split)):
        (folder / name).write_text("\n".join(lines) + "\n")


def write_domainnet(root: Path, domains: int = 2, per_split: int = 3) -> None:
    folder = root / "domainnet"
    from cfl.data.domainnet import DOMAINS

    for d, domain in enumerate(DOMAINS[:domains]):
        for split in ("train", "test"):
            lines = []
            for i in range(per_split):
                rel = f"{domain}/class_{i}/{domain}_{split}_{i}.png"
                write_image(folder / rel, 40 * d + i)
                lines.append(f"{rel} {i * 100}")
            (folder / f"{domain}_{split}.txt").write_text("\n".join(lines) + "\n")
