"""ImageNet-R, CUB-200 and DomainNet read from generated files of their on-disk layouts (tiny PIL images):
labels, splits, stored size, the cache, refusals naming the file and the layout, the memory check; and the
CIFAR-100 stream resized to a backbone's input size by the pretrained preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.data import image_file_streams
from cfl.data.cub import cub_listing
from cfl.data.image_files import check_memory, decode_resized
from cfl.data.imagenet_r import imagenet_r_listing
from cfl.data.request import StreamRequest
from cfl.data.stream_registry import STREAMS
from tests import fake_data

PIL = pytest.importorskip("PIL.Image")
_imagenet_r, _cub, _domainnet = fake_data.write_imagenet_r, fake_data.write_cub, fake_data.write_domainnet



def test_decode_resized_fits_the_shorter_side_and_centre_crops(tmp_path):
    img = np.zeros((8, 24, 3), dtype=np.uint8)
    img[:, :8] = 255  # white left and black right thirds, cropped away by the centre crop of the 8 x 24 image
    img[:, 8:16] = 100
    PIL.fromarray(img).save(tmp_path / "a.png")
    out = decode_resized([tmp_path / "a.png"], 4, "Demo", "fix")
    assert out.shape == (1, 3, 4, 4) and out.dtype == torch.uint8
    assert 85 < int(out.min()) and int(out.max()) < 115  # ~100: bicubic rings a little at the cut


def test_imagenet_r_classes_by_sorted_wnid_and_a_fixed_global_80_20_split(tmp_path):
    wnids = _imagenet_r(tmp_path, classes=4, per_class=5)
    (train_files, train_y), (test_files, test_y) = imagenet_r_listing(tmp_path)
    assert len(train_files) == 16 and len(test_files) == 4  # int(0.8 * 20)
    assert all(sorted(wnids).index(f.parent.name) == y for f, y in zip(train_files + test_files, train_y + test_y,
                                                                       strict=True))
    files = sorted(tmp_path.glob("imagenet-r/*/*.jpg"))
    expected = [files[i] for i in np.random.RandomState(0).permutation(20)[16:]]
    assert test_files == expected  # the same split on every run and machine
    assert imagenet_r_listing(tmp_path)[1][0] == test_files


def test_imagenet_r_stream_at_224_px_class_incremental_and_cached(tmp_path):
    _imagenet_r(tmp_path, per_class=12)  # the fixed split leaves each of the 20 classes a test image from 12 on
    req = StreamRequest(num_tasks=1, scenario="class", seed=5, data_root=tmp_path, download=False)
    stream = STREAMS["imagenet-r"].build(req)
    task = stream.tasks[0]
    assert stream.scenario == "class" and stream.classes_per_head == 200 and task.classes == list(range(20))
    assert task.train_x.shape[1:] == (3, 224, 224) and len(task.train_x) + len(task.test_x) == 240
    # each class is one grey level: normalised pixels identical within a class, increasing with the label
    levels = [task.train_x[task.train_y == c][:, 0, 0, 0] for c in range(20) if (task.train_y == c).any()]
    assert all(torch.all(v == v[0]) for v in levels) and [float(v[0]) for v in levels] == sorted(float(v[0])
                                                                                                  for v in levels)
    assert len(list((tmp_path / "cache").glob("imagenet-r-224px-*.pt"))) == 1
    again = STREAMS["imagenet-r"].build(req)
    assert torch.equal(again.tasks[0].test_x, task.test_x)


@pytest.mark.parametrize(("damage", "words"), [
    (lambda _root: None, ["ImageNet-R", "imagenet-r", "the folder is absent"]),
    (lambda root: (root / "imagenet-r").mkdir(), ["holds no class folder", "imagenet-r/<wnid>/*.jpg"]),
    (lambda root: (root / "imagenet-r" / "n01").mkdir(parents=True), ["class folder", "n01 holds no", "<wnid>"]),
])
def test_imagenet_r_malformed_layouts_are_refused_naming_the_folder(tmp_path, damage, words):
    damage(tmp_path)
    with pytest.raises(ConfigError) as err:
        imagenet_r_listing(tmp_path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_an_undecodable_image_is_refused_naming_it(tmp_path):
    _imagenet_r(tmp_path)
    bad = sorted(tmp_path.glob("imagenet-r/*/*.jpg"))[3]
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(ConfigError, match=f"cannot decode the image {bad}"):
        STREAMS["imagenet-r"].build(StreamRequest(1, "class", 0, tmp_path, False))


def test_cub_official_split_and_labels_from_one(tmp_path):
    _cub(tmp_path, classes=3, per_class=4)
    (train_files, train_y), (test_files, test_y) = cub_listing(tmp_path)
    assert train_y == [0, 0, 1, 1, 2, 2] and test_y == [0, 0, 1, 1, 2, 2]
    assert train_files[0] == tmp_path / "CUB_200_2011" / "images" / "001.Bird_0" / "Bird_0_0.jpg"


def test_cub_stream_task_incremental(tmp_path):
    _cub(tmp_path)
    stream = STREAMS["cub-200"].build(StreamRequest(1, "task", 0, tmp_path, False))
    assert stream.classes_per_head == 20 and stream.tasks[0].train_x.shape == (40, 3, 224, 224)
    assert sorted(set(stream.tasks[0].test_y.tolist())) == list(range(20))


@pytest.mark.parametrize(("damage", "words"), [
    (lambda f: (f / "train_test_split.txt").unlink(), ["train_test_split.txt", "the file is absent", "<1|0>"]),
    (lambda f: (f / "images.txt").write_text("1 a.jpg extra\n"), ["images.txt", "line 1 reads", "<image id> <path>"]),
    (lambda f: (f / "image_class_labels.txt").write_text("1 201\n"), ["image_class_labels.txt", "1..200"]),
    (lambda f: (f / "images" / "001.Bird_0" / "Bird_0_0.jpg").unlink(), ["lists", "Bird_0_0.jpg", "not a file"]),
])
def test_cub_malformed_layouts_are_refused_naming_the_file(tmp_path, damage, words):
    _cub(tmp_path, classes=2, per_class=2)
    damage(tmp_path / "CUB_200_2011")
    with pytest.raises(ConfigError) as err:
        cub_listing(tmp_path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_domainnet_one_task_per_domain_with_shared_labels(tmp_path):
    _domainnet(tmp_path)
    stream = STREAMS["domainnet"].build(StreamRequest(2, "domain", 0, tmp_path, False))
    assert [t.name for t in stream.tasks] == ["domainnet-clipart", "domainnet-infograph"]
    assert stream.classes_per_head == 345 and stream.tasks[1].train_y.tolist() == [0, 100, 200]
    assert stream.tasks[0].test_x.shape == (3, 3, 224, 224)


@pytest.mark.parametrize(("damage", "words"), [
    (lambda f: (f / "infograph_test.txt").unlink(), ["infograph_test.txt", "the split list is absent"]),
    (lambda f: (f / "clipart_train.txt").write_text("clipart/a.png 345\n"), ["clipart_train.txt", "line 1",
                                                                             "<label 0..344>"]),
    (lambda f: (f / "clipart_train.txt").write_text("clipart/none.png 3\n"), ["lists", "none.png", "not a file"]),
])
def test_domainnet_malformed_layouts_are_refused_naming_the_file(tmp_path, damage, words):
    _domainnet(tmp_path)
    damage(tmp_path / "domainnet")
    with pytest.raises(ConfigError) as err:
        STREAMS["domainnet"].build(StreamRequest(2, "domain", 0, tmp_path, False))
    assert all(w in str(err.value) for w in words), str(err.value)
    assert not (tmp_path / "cache").exists()  # refused before any image was decoded


def test_a_stream_larger_than_the_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"1,000 images at 224x224 px need 0.8 GB .* 0.1 GB is available"):
        check_memory("Demo", 1000, 224, "fix", available=10**8)
    check_memory("Demo", 1000, 224, "fix", available=10**9)
    _domainnet(tmp_path)
    monkeypatch.setattr(image_file_streams, "check_memory",
                        lambda *a: check_memory(*a, available=10))
    with pytest.raises(ConfigError, match="lower stream.num_tasks"):
        STREAMS["domainnet"].build(StreamRequest(1, "domain", 0, tmp_path, False))
    assert not (tmp_path / "cache").exists()


def test_split_cifar100_is_resized_to_the_backbones_input_by_the_pretrained_preprocessing(tmp_path):
    from cfl.data.benchmarks import split_cifar100
    from cfl.pretrained.preprocessing import Preprocessing, prepared, unit_range
    fake_data.write_cifar100(tmp_path)
    stream = split_cifar100(StreamRequest(1, "task", 0, tmp_path, False))
    low, high = unit_range([t.train_x for t in stream.tasks])
    pre = Preprocessing(224, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic")
    x = prepared(stream.tasks[0].train_x[:2], pre, low, high)
    assert x.shape == (2, 3, 224, 224)
    assert float(x.min()) >= -1 - 0.2 and float(x.max()) <= 1 + 0.2  # [0, 1] mapped to [-1, 1], bicubic overshoot
