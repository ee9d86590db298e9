"""Each dataset reader on small files written in the real format: values, layout, labels, errors, cache."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.data.augment import CropFlip
from cfl.data.cache import cached_tensors
from cfl.data.cifar import cifar10_files, cifar100_files, read_cifar10, read_cifar100
from cfl.data.files import locate
from cfl.data.idx import read_idx
from cfl.data.mini_imagenet import mini_imagenet_sources, read_mini_imagenet_pickles
from cfl.data.mnist_like import FASHION_MNIST, MNIST, IdxDataset, load_idx, load_idx_raw
from cfl.data.notmnist import notmnist_files, read_notmnist
from cfl.data.svhn import read_svhn, svhn_files
from tests import fake_data


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    arrays = fake_data.write_idx_dataset(tmp_path / "mnist", gz=gz)
    suffix = ".gz" if gz else ""
    images = read_idx(tmp_path / "mnist" / f"train-images-idx3-ubyte{suffix}")
    labels = read_idx(tmp_path / "mnist" / f"train-labels-idx1-ubyte{suffix}")
    assert images.dtype == torch.uint8 and images.shape == (60, 28, 28)
    assert torch.equal(images, torch.from_numpy(arrays["train_x"]))
    assert labels.tolist() == arrays["train_y"].tolist()


def test_idx_rejects_bad_and_truncated_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")
    fake_data.write_idx(tmp_path / "short", np.zeros((4, 3), dtype=np.uint8), gz=False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")


def test_mnist_normalised_and_found_in_torchvision_layout(tmp_path):
    arrays = fake_data.write_idx_dataset(tmp_path / "MNIST" / "raw", gz=False)
    (train_x, train_y), (test_x, test_y) = load_idx(MNIST, tmp_path)
    assert train_x.shape == (60, 1, 28, 28) and test_x.shape == (20, 1, 28, 28)
    expected = (arrays["t10k_x"][3, 5, 7] / 255.0 - 0.1307) / 0.3081
    assert test_x[3, 0, 5, 7].item() == pytest.approx(expected, rel=1e-5)
    assert train_y.dtype == torch.long and test_y.tolist() == arrays["t10k_y"].tolist()


def test_idx_cache_is_written_reused_and_keyed_by_the_files(tmp_path):
    fake_data.write_idx_dataset(tmp_path / "mnist")
    first = load_idx_raw(MNIST, tmp_path)
    cached = list((tmp_path / "cache").glob("mnist-*.pt"))
    assert len(cached) == 1
    again = load_idx_raw(MNIST, tmp_path)
    assert torch.equal(first["train_x"], again["train_x"])
    # new labels (same size, later mtime) -> a new cache entry with the new content
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte.gz"
    fake_data.write_idx(labels, np.full(60, 3), gz=True)
    os.utime(labels, ns=(labels.stat().st_atime_ns, labels.stat().st_mtime_ns + 10**9))
    assert set(load_idx_raw(MNIST, tmp_path)["train_y"].tolist()) == {3}
    assert len(list((tmp_path / "cache").glob("mnist-*.pt"))) == 2


@pytest.mark.parametrize("bad", [{"images": torch.zeros(2)}, [torch.zeros(2)],
                                 {"train_x": torch.zeros(3, 28, 28), "train_y": torch.zeros(2), "test_x": 1,
                                  "test_y": torch.zeros(1)}])
def test_cache_with_wrong_content_is_rebuilt_with_a_warning(tmp_path, bad):
    fake_data.write_idx_dataset(tmp_path / "mnist")
    first = load_idx_raw(MNIST, tmp_path)
    (cache,) = (tmp_path / "cache").glob("mnist-*.pt")
    torch.save(bad, cache)
    with pytest.warns(UserWarning, match=f"{cache}.*rebuilding"):
        again = load_idx_raw(MNIST, tmp_path)
    assert set(again) == set(first) and all(torch.equal(again[k], first[k]) for k in first)
    assert set(torch.load(cache, weights_only=True)) == set(first)  # the cache file was rewritten


@pytest.mark.parametrize(("key", "change", "why"), [
    ("train_y", lambda y: y.fill_(10), "train_y: labels 10..10, expected 0..9"),
    ("test_y", lambda y: y.sub(1), "test_y: labels -1..8, expected 0..9"),
    ("train_y", lambda y: y.float(), "expected uint8 and int64"),
    ("test_x", lambda x: x.long(), "expected uint8 and int64"),
    ("train_x", lambda x: x[:, :27, :27], "expected (N, 28, 28)"),
])
def test_cache_failing_the_readers_checks_is_rebuilt_with_a_warning(tmp_path, key, change, why):
    fake_data.write_idx_dataset(tmp_path / "mnist")
    first = load_idx_raw(MNIST, tmp_path)
    (cache,) = (tmp_path / "cache").glob("mnist-*.pt")
    torch.save({**first, key: change(first[key].clone())}, cache)
    with pytest.warns(UserWarning, match=f"{cache} fails the reader's checks .*{re.escape(why)}.*rebuilding"):
        again = load_idx_raw(MNIST, tmp_path)
    assert all(torch.equal(again[k], first[k]) for k in first)
    assert torch.equal(torch.load(cache, weights_only=True)[key], first[key])  # the cache file was rewritten


def test_cache_builds_once(tmp_path):
    src = tmp_path / "src"
    src.write_text("x")
    calls = []

    def build():
        calls.append(1)
        return {"a": torch.arange(3)}

    for _ in range(2):
        assert cached_tensors(tmp_path / "cache", "demo", [src], build, keys=("a",))["a"].tolist() == [0, 1, 2]
    assert len(calls) == 1


def test_missing_data_names_dataset_paths_and_fix(tmp_path):
    nowhere = IdxDataset("Fashion-MNIST", ("fashion-mnist",), (), "FashionMNIST", 0.286, 0.353)
    with pytest.raises(ConfigError) as err:
        load_idx_raw(nowhere, tmp_path)
    text = str(err.value)
    assert "Fashion-MNIST" in text and str(tmp_path / "fashion-mnist") in text and "stream.download: true" in text


def test_locate_downloads_only_when_nothing_is_there_and_refuses_a_failed_download(tmp_path):
    candidates = [tmp_path / "a", tmp_path / "b"]
    calls = []

    def fetch() -> None:
        calls.append(1)
        candidates[1].mkdir()
        (candidates[1] / "y").write_text("")

    assert locate("Demo", candidates, ["x|y"], "fix it", fetch) == candidates[1] and len(calls) == 1
    assert locate("Demo", candidates, ["x|y"], "fix it", fetch) == candidates[1] and len(calls) == 1

    def offline() -> None:
        raise RuntimeError("no network")

    with pytest.raises(ConfigError) as err:
        locate("Demo", [tmp_path / "c"], ["x"], "fix it", offline)
    assert all(w in str(err.value) for w in ("Demo", "download failed: no network", str(tmp_path / "c"), "fix it"))
    with pytest.raises(ConfigError, match=r"Demo: data files not found[\s\S]*To get them: fix it"):
        locate("Demo", [tmp_path / "c"], ["x"], "fix it")  # no download allowed
    assert locate("Demo", [tmp_path], ["b"], "fix it", present=Path.is_dir) == tmp_path  # a folder named b
    with pytest.raises(ConfigError, match="Demo"):
        locate("Demo", [tmp_path], ["b"], "fix it")  # b is not a file


def test_unreadable_idx_is_a_config_error(tmp_path):
    fake_data.write_idx_dataset(tmp_path / "mnist")
    (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    with pytest.raises(ConfigError, match="MNIST"):
        load_idx_raw(MNIST, tmp_path)


def test_fashion_mnist_system_copy_is_a_fallback(tmp_path):
    assert Path("/usr/share/datasets/fashion-mnist") in FASHION_MNIST.candidates(tmp_path)
    assert FASHION_MNIST.candidates(tmp_path)[0] == tmp_path / "fashion-mnist"


def test_cifar10_pickles(tmp_path):
    fake_data.write_cifar10(tmp_path)
    raw = read_cifar10(cifar10_files(tmp_path))
    assert raw["train_x"].shape == (100, 3, 32, 32) and raw["test_x"].shape == (20, 3, 32, 32)
    # channel-major rows: pixel (c, h, w) of image i is data[i, c*1024 + h*32 + w]
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as fh:
        batch = pickle.load(fh, encoding="bytes")
    assert raw["test_x"][4, 2, 3, 5].item() == batch[b"data"][4, 2 * 1024 + 3 * 32 + 5]
    assert raw["test_y"].tolist() == batch[b"labels"]
    # class-dependent content: brightness grows with the label
    means = [raw["train_x"][raw["train_y"] == c].float().mean().item() for c in range(10)]
    assert means == sorted(means)


def test_cifar100_pickles_use_fine_labels(tmp_path):
    fake_data.write_cifar100(tmp_path)
    raw = read_cifar100(cifar100_files(tmp_path))
    assert raw["train_x"].shape == (200, 3, 32, 32)
    assert sorted(set(raw["train_y"].tolist())) == list(range(100))
    assert raw["train_y"][0].item() == 99  # written in reverse label order


def test_cifar_missing_and_broken(tmp_path):
    with pytest.raises(ConfigError, match=r"CIFAR-100[\s\S]*cifar-100-python"):
        cifar100_files(tmp_path)
    fake_data.write_cifar100(tmp_path)
    (tmp_path / "cifar-100-python" / "test").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="cannot read"):
        read_cifar100(cifar100_files(tmp_path))


def test_svhn_mat_files(tmp_path):
    fake_data.write_svhn(tmp_path)
    raw = read_svhn(svhn_files(tmp_path))
    assert raw["train_x"].shape == (30, 3, 32, 32) and raw["train_x"].dtype == torch.uint8
    assert raw["train_y"].tolist() == [i % 10 for i in range(30)]  # stored label 10 is the digit 0
    expected = fake_data.class_images(np.arange(20) % 10, 32, 32, channels=3, seed=1)
    assert torch.equal(raw["test_x"], torch.from_numpy(expected).permute(0, 3, 1, 2))


def test_notmnist_png_folders(tmp_path):
    fake_data.write_notmnist(tmp_path, per_letter=6)
    with pytest.warns(UserWarning, match=r"skipped 10 unreadable PNG files \(e.g. .*A/broken.png\)"):
        raw = read_notmnist(notmnist_files(tmp_path))
    # 6 readable PNGs per letter (the empty file is skipped): indices 0 and 5 of each sorted list are test
    assert raw["train_x"].shape == (40, 28, 28) and raw["test_x"].shape == (20, 28, 28)
    assert raw["test_y"].tolist() == [c for c in range(10) for _ in range(2)]
    bright = [raw["train_x"][raw["train_y"] == c].float().mean().item() for c in range(10)]
    assert bright == sorted(bright)


def test_notmnist_letter_without_two_readable_images_is_refused(tmp_path):
    fake_data.write_notmnist(tmp_path, per_letter=6)
    for png in (tmp_path / "notMNIST_small" / "C").glob("img*.png"):
        png.unlink()
    with pytest.raises(ConfigError, match=r"0 readable PNG files for the letter C[\s\S]*notMNIST_small/C"):
        read_notmnist(notmnist_files(tmp_path))


def test_notmnist_missing_says_where(tmp_path):
    with pytest.raises(ConfigError, match=r"notMNIST[\s\S]*notMNIST_small"):
        notmnist_files(tmp_path)


def test_mini_imagenet_pickles(tmp_path):
    wnids = fake_data.write_mini_imagenet(tmp_path, classes=10, per_class=6)
    kind, files = mini_imagenet_sources(tmp_path)
    assert kind == "pickle"
    raw = read_mini_imagenet_pickles(files)
    assert raw["train_x"].shape == (50, 3, 84, 84) and raw["test_x"].shape == (10, 3, 84, 84)
    # class ids follow sorted wnids (a non-standard class set); the last image of each class is its test image
    order = sorted(wnids)
    with open(tmp_path / "mini-imagenet" / "mini-imagenet-cache-train.pkl", "rb") as fh:
        first = pickle.load(fh)
    wnid = next(iter(first["class_dict"]))
    label = order.index(wnid)
    last_row = first["class_dict"][wnid][-1]
    test_img = raw["test_x"][raw["test_y"] == label][0]
    assert torch.equal(test_img, torch.from_numpy(first["image_data"][last_row]).permute(2, 0, 1))


def test_mini_imagenet_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"Mini-ImageNet[\s\S]*mini-imagenet-cache-train.pkl"):
        mini_imagenet_sources(tmp_path)


def test_crop_flip_moves_pixels_and_pads_with_black():
    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5)
    black = torch.tensor([-7.0])
    gen = torch.Generator().manual_seed(0)
    out = CropFlip(2, black)(x, gen)
    padded = torch.full((2, 1, 9, 9), -7.0)
    padded[:, :, 2:7, 2:7] = x
    for i in range(2):  # the output is one of the 25 crops of the padded image, maybe mirrored
        crops = [padded[i, :, a:a + 5, b:b + 5] for a in range(5) for b in range(5)]
        assert any(torch.equal(out[i], c) or torch.equal(out[i], c.flip(-1)) for c in crops)
    outs = torch.stack([CropFlip(2, black)(x, torch.Generator().manual_seed(s)) for s in range(20)])
    assert not torch.equal(outs[0], outs[1]) or not torch.equal(outs[0], outs[2])
    assert torch.equal(CropFlip(0, black)(x, torch.Generator().manual_seed(1)).abs().sum(), x.sum())
