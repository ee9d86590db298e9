"""Stream registry: ``cfl list`` names -> builders of in-memory :class:`Stream` objects and what they promise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cfl.data import benchmarks
from cfl.data.derive import permuted_tasks, split_tasks
from cfl.data.digits import load_digits_tensors
from cfl.data.image_file_streams import cub200, domainnet, imagenet_r
from cfl.data.mnist_like import FASHION_MNIST, idx_folder, load_idx
from cfl.data.request import StreamRequest
from cfl.data.stream import Stream
from cfl.registry import Registry

#: the config keys of ``stream`` that a builder may or may not read (``StreamEntry.reads``)
OPTIONAL_FIELDS = ("seed", "download")
SEED, DOWNLOAD, BOTH = frozenset({"seed"}), frozenset({"download"}), frozenset(OPTIONAL_FIELDS)


@dataclass(frozen=True)
class StreamEntry:
    """A registered stream: its builder and what it promises before any data is loaded."""

    build: Callable[[StreamRequest], Stream]
    full_tasks: int
    scenarios: tuple[str, ...]  # first is the default
    # what a model must fit, known without loading data (checked against the built streams in the tests)
    input_shape: tuple[int, ...]
    classes_per_task: int  # the class-incremental head has classes_per_task * full_tasks outputs
    default_model: str  # what `model: auto` resolves to
    head: int | None = None  # outputs of the head when not classes_per_task-derived (a given Stream object)
    # which of the request's optional fields (OPTIONAL_FIELDS) the builder reads; None: not declared (a plugin's
    # stream), then a config may set any of them. A set field the builder does not read is refused.
    reads: frozenset[str] | None = None

    def head_classes(self, scenario: str) -> int:
        """Outputs of a head under ``scenario`` (the stream's own default when ``auto``)."""
        if self.head is not None:
            return self.head
        return self.classes_per_task * self.full_tasks if scenario == "class" else self.classes_per_task


def _permuted_digits(req: StreamRequest) -> Stream:
    train, test = load_digits_tensors()
    tasks = permuted_tasks(train, test, req.num_tasks, req.seed, "perm-digits")
    return Stream("permuted-digits", "domain", tasks, 10, (64,), "digits-mlp")


def _split_digits(req: StreamRequest) -> Stream:
    train, test = load_digits_tensors()
    tasks = split_tasks(train, test, 2, req.num_tasks, req.scenario == "class", "split-digits")
    classes = 10 if req.scenario == "class" else 2
    return Stream("split-digits", req.scenario, tasks, classes, (1, 8, 8), "digits-mlp")


def _permuted_fmnist(req: StreamRequest) -> Stream:
    train, test = load_idx(FASHION_MNIST, req.data_root, req.download)
    tasks = permuted_tasks(train, test, req.num_tasks, req.seed, "perm-fmnist")
    return Stream("permuted-fmnist", "domain", tasks, 10, (784,), "mlp")


def _split_fmnist(req: StreamRequest) -> Stream:
    train, test = load_idx(FASHION_MNIST, req.data_root, req.download)
    source = f"the IDX files in {idx_folder(FASHION_MNIST, req.data_root)}"
    tasks = split_tasks(train, test, 2, req.num_tasks, req.scenario == "class", "split-fmnist", source)
    classes = 10 if req.scenario == "class" else 2
    return Stream("split-fmnist", req.scenario, tasks, classes, (1, 28, 28), "mlp")


STREAMS: Registry[StreamEntry] = Registry("stream")
STREAMS.register("permuted-digits", StreamEntry(_permuted_digits, 10, ("domain",), (64,), 10, "digits-mlp", reads=SEED),
                 about="sklearn 8x8 digits, one pixel permutation per task (offline)")
STREAMS.register("split-digits", StreamEntry(_split_digits, 5, ("task", "class"), (1, 8, 8), 2, "digits-mlp",
                                             reads=frozenset()),
                 about="sklearn 8x8 digits, 5 tasks of 2 classes (offline)")
STREAMS.register("permuted-fmnist", StreamEntry(_permuted_fmnist, 10, ("domain",), (784,), 10, "mlp", reads=BOTH),
                 about="Fashion-MNIST, one pixel permutation per task, 784 inputs, shared head")
STREAMS.register("split-fmnist",
                 StreamEntry(_split_fmnist, 5, ("task", "class"), (1, 28, 28), 2, "mlp", reads=DOWNLOAD),
                 about="Fashion-MNIST, 5 tasks of 2 classes in label order")
STREAMS.register("permuted-mnist",
                 StreamEntry(benchmarks.permuted_mnist, 10, ("domain",), (784,), 10, "mlp", reads=BOTH),
                 about="MNIST, Avalanche PermutedMNIST permutations, 784 inputs, shared head")
STREAMS.register("split-cifar100",
                 StreamEntry(benchmarks.split_cifar100, 10, ("task", "class"), (3, 32, 32), 10, "alexnet",
                             reads=DOWNLOAD),
                 about="CIFAR-100, 10 tasks of 10 classes in label order")
STREAMS.register("five-datasets",
                 StreamEntry(benchmarks.five_datasets, 5, ("task",), (3, 32, 32), 10, "resnet18-reduced",
                             reads=DOWNLOAD),
                 about="CIFAR-10, MNIST, SVHN, Fashion-MNIST, notMNIST; 32x32x3, one task each")
STREAMS.register("mini-imagenet", StreamEntry(benchmarks.mini_imagenet, 20, ("task",), (3, 84, 84), 5, "resnet18-mini",
                                             reads=frozenset()),
                 about="Mini-ImageNet 84x84, 20 tasks of 5 classes, train-time crop+flip")
STREAMS.register("imagenet-r", StreamEntry(imagenet_r, 10, ("class", "task"), (3, 224, 224), 20, "vit-b16",
                                          reads=frozenset()),
                 about="ImageNet-R at 224 px, 10 tasks of 20 classes, a fixed 80/20 split (for pretrained ViTs)")
STREAMS.register("domainnet", StreamEntry(domainnet, 6, ("domain",), (3, 224, 224), 345, "vit-b16", reads=frozenset()),
                 about="DomainNet at 224 px, one task per domain (6), 345 classes, the official split lists")
STREAMS.register("cub-200", StreamEntry(cub200, 10, ("class", "task"), (3, 224, 224), 20, "vit-b16",
                                       reads=frozenset()),
                 about="CUB-200-2011 at 224 px, 10 tasks of 20 classes, the official split (for pretrained ViTs)")
