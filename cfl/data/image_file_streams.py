"""Builders of the streams of the pretrained-backbone papers read from one file per image:
ImageNet-R and CUB-200 (class-incremental, 10 tasks of 20 classes), DomainNet (domain-incremental, one task per
domain, 345 classes). The images a run's tasks need are decoded at the stored size (224 px,
:mod:`cfl.data.image_files`) and cached as uint8 tensors under ``<data root>/cache/``; each is then normalised
per channel with its training set's mean and std like the other image streams."""

from __future__ import annotations

from pathlib import Path

import torch

from cfl.data.benchmarks import channel_normalise
from cfl.data.cache import Layout, cached_tensors
from cfl.data.cub import cub_listing
from cfl.data.cub import how_to_get as cub_how
from cfl.data.derive import split_tasks
from cfl.data.domainnet import CLASSES, DOMAINS, domainnet_listing
from cfl.data.domainnet import how_to_get as domainnet_how
from cfl.data.files import require_classes
from cfl.data.image_files import STORED_SIZE, check_memory, decode_resized
from cfl.data.imagenet_r import how_to_get as imagenet_r_how
from cfl.data.imagenet_r import imagenet_r_listing
from cfl.data.request import StreamRequest
from cfl.data.stream import Stream, Task

Listing = tuple[list[Path], list[int]]
CLASSES_PER_TASK = 20
SHAPE = (3, STORED_SIZE, STORED_SIZE)


def _kept(listing: Listing, classes: int) -> Listing:
    """The images of labels below ``classes`` (a prefix of the tasks needs only those)."""
    rows = [i for i, y in enumerate(listing[1]) if y < classes]
    return [listing[0][i] for i in rows], [listing[1][i] for i in rows]


def image_tensors(dataset: str, name: str, root: Path, train: Listing, test: Listing, classes: int,
                  how: str) -> dict[str, torch.Tensor]:
    """uint8 tensors of the listed images at the stored size, cached under ``root/cache``; the memory they take
    is checked before any image is decoded."""
    check_memory(dataset, len(train[0]) + len(test[0]), STORED_SIZE,
                 f"lower stream.num_tasks (only the images of the tasks used are decoded), or run on a machine with "
                 f"more memory ({how})")

    def build() -> dict[str, torch.Tensor]:
        return {"train_x": decode_resized(train[0], STORED_SIZE, dataset, how),
                "train_y": torch.tensor(train[1], dtype=torch.long),
                "test_x": decode_resized(test[0], STORED_SIZE, dataset, how),
                "test_y": torch.tensor(test[1], dtype=torch.long)}

    return cached_tensors(root / "cache", f"{name}-{STORED_SIZE}px", train[0] + test[0], build,
                          layout=Layout(SHAPE, classes))


def _class_split(req: StreamRequest, dataset: str, name: str, listings: tuple[Listing, Listing], how: str) -> Stream:
    needed = CLASSES_PER_TASK * req.num_tasks
    train, test = (_kept(listing, needed) for listing in listings)
    raw = image_tensors(dataset, name, req.data_root, train, test, 200, how)
    require_classes(dataset, [req.data_root], raw, needed, how)
    (train_x, train_y), (test_x, test_y), _ = channel_normalise(raw)
    tasks = split_tasks((train_x, train_y), (test_x, test_y), CLASSES_PER_TASK, req.num_tasks,
                        req.scenario == "class", name)
    classes = 200 if req.scenario == "class" else CLASSES_PER_TASK
    return Stream(name, req.scenario, tasks, classes, SHAPE, "vit-b16")


def imagenet_r(req: StreamRequest) -> Stream:
    """ImageNet-R: 10 tasks of 20 classes in label order (sorted wnids), CODA-P's kind of 80/20 split."""
    return _class_split(req, "ImageNet-R", "imagenet-r", imagenet_r_listing(req.data_root),
                        imagenet_r_how(req.data_root))


def cub200(req: StreamRequest) -> Stream:
    """CUB-200-2011: 10 tasks of 20 classes in label order, the official train/test split."""
    return _class_split(req, "CUB-200", "cub-200", cub_listing(req.data_root), cub_how(req.data_root))


def domainnet(req: StreamRequest) -> Stream:
    """DomainNet: one task per domain (clipart, infograph, painting, quickdraw, real, sketch), 345 shared labels."""
    how = domainnet_how(req.data_root)
    listings = [domainnet_listing(req.data_root, d) for d in DOMAINS[: req.num_tasks]]  # every list read first
    check_memory("DomainNet", sum(len(tr[0]) + len(te[0]) for tr, te in listings), STORED_SIZE,
                 f"lower stream.num_tasks (only the domains used are decoded), or run on a machine with more "
                 f"memory ({how})")
    tasks = []
    for domain, (train, test) in zip(DOMAINS, listings, strict=False):
        raw = image_tensors("DomainNet", f"domainnet-{domain}", req.data_root, train, test, CLASSES, how)
        (train_x, train_y), (test_x, test_y), _ = channel_normalise(raw)
        tasks.append(Task(f"domainnet-{domain}", train_x, train_y, test_x, test_y, list(range(CLASSES))))
    return Stream("domainnet", "domain", tasks, CLASSES, SHAPE, "vit-b16")
