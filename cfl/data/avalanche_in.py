"""Avalanche benchmark -> cfl :class:`Stream`: every experience turned into tensors once.

Avalanche (avalanche-lib 0.6) is imported lazily by the caller's benchmark, never here at import time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from cfl.config.schema import ConfigError
from cfl.data.stream import SCENARIOS, Stream, Task
from cfl.data.stream_checks import check_stream

SUPPORTED = ("from_avalanche supports classification benchmarks whose experiences hold (input, class id"
             "[, task label]) samples with tensor or PIL-image inputs, one task label per experience, "
             "e.g. SplitMNIST, PermutedMNIST or nc_benchmark/ni_benchmark/benchmark_from_datasets over "
             "classification datasets")
BATCH = 4096  # samples per DataLoader batch while converting


def _refuse(what: str) -> ConfigError:
    return ConfigError(f"{what}: {SUPPORTED}")


def _as_input(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    from PIL import Image

    if isinstance(x, Image.Image):
        from torchvision.transforms.functional import to_tensor

        return to_tensor(x)
    raise _refuse(f"a sample's input is a {type(x).__name__}, not a tensor or PIL image")


def _as_class_id(y: Any) -> int:
    if isinstance(y, torch.Tensor) and y.numel() == 1 and not y.is_floating_point():
        return int(y)
    if isinstance(y, int):
        return y
    kind = "a float (regression?)" if isinstance(y, float) or torch.is_tensor(y) and y.is_floating_point() \
        else f"a {type(y).__name__} (detection?)"
    raise _refuse(f"a sample's target is {kind}, not a class id")


def _collate(batch: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not isinstance(batch[0], (tuple, list)) or len(batch[0]) < 2:
        raise _refuse(f"a sample is a {type(batch[0]).__name__}, not an (input, class id[, task label]) tuple")
    x = torch.stack([_as_input(s[0]) for s in batch])
    y = torch.tensor([_as_class_id(s[1]) for s in batch], dtype=torch.long)
    t = torch.tensor([int(s[2]) if len(s) > 2 else 0 for s in batch], dtype=torch.long)
    return x, y, t


def experience_tensors(experience: Any, workers: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(inputs, class ids, task label) of one experience, read with the dataset's eval transforms in
    batches of ``BATCH`` (``workers`` DataLoader processes run the benchmark's per-sample transforms)."""
    if hasattr(experience, "origin_experience"):
        raise _refuse("an online stream's sub-experiences cannot be converted (give the original stream)")
    if "Detection" in type(experience).__name__:
        raise _refuse(f"{type(experience).__name__} is a detection experience")
    data = experience.dataset
    data = data.eval() if hasattr(data, "eval") else data
    parts = list(DataLoader(data, batch_size=BATCH, shuffle=False, num_workers=workers,
                            collate_fn=_collate))
    if not parts:
        raise _refuse(f"experience {experience.current_experience} is empty")
    x, y, t = (torch.cat(p) for p in zip(*parts, strict=True))
    if int(y.min()) < 0:
        raise _refuse(f"experience {experience.current_experience} has negative class ids")
    labels = sorted(set(t.tolist()))
    if len(labels) != 1:
        raise _refuse(f"experience {experience.current_experience} mixes task labels {labels}")
    return x.contiguous(), y, labels[0]


def infer_scenario(task_labels: list[int], class_sets: list[list[int]]) -> str:
    """task: one distinct task label per experience; domain: one shared label and the same classes in every
    experience; class: one shared label, classes that differ between experiences."""
    if len(set(task_labels)) == len(task_labels) > 1:
        return "task"
    if len(set(task_labels)) > 1:
        raise ConfigError(f"the experiences' task labels {task_labels} repeat but are not all equal, so the "
                          f"scenario is ambiguous: pass scenario= one of {SCENARIOS}")
    return "domain" if all(c == class_sets[0] for c in class_sets) else "class"


def _head_order(benchmark: Any, t: int, classes: list[int], local: bool) -> tuple[list[int], dict[int, int]]:
    """Global class ids in head order and the map class id -> head output (identity unless ``local``:
    task-incremental heads).

    A benchmark built with ``class_ids_from_zero_in_each_exp`` already holds head outputs as labels;
    its ``classes_order_original_ids`` give the global ids. Otherwise labels are global ids, sorted."""
    if not local:
        return classes, {c: c for c in classes}
    if getattr(benchmark, "class_ids_from_zero_in_each_exp", False):
        start = sum(benchmark.n_classes_per_exp[:t])
        original = [int(c) for c in benchmark.classes_order_original_ids[start:start + benchmark.n_classes_per_exp[t]]]
        return original, {i: i for i in range(len(original))}
    return classes, {c: i for i, c in enumerate(classes)}


def _relabel(y: torch.Tensor, mapping: dict[int, int], where: str) -> torch.Tensor:
    lookup = torch.full((max(int(y.max()), max(mapping)) + 1,), -1, dtype=torch.long)
    for c, i in mapping.items():
        lookup[c] = i
    out = lookup[y]
    if bool((out < 0).any()):
        raise ConfigError(f"{where} holds classes {sorted(set(y[out < 0].tolist()))} that its training "
                          f"experience lacks; cfl scores each task on the classes it trains")
    return out


def _default_model(shape: tuple[int, ...]) -> str:
    numel = 1
    for s in shape:
        numel *= s
    if numel <= 256:
        return "digits-mlp"
    if len(shape) == 3 and shape[0] == 3 and shape[1] == shape[2]:
        return "resnet18-reduced"
    return "mlp"


def from_avalanche(benchmark: Any, *, scenario: str = "auto", name: str | None = None,
                   default_model: str | None = None, workers: int = 0) -> Stream:
    """A cfl :class:`Stream` holding ``benchmark``'s train/test experiences as tensors, in order.

    ``scenario``: ``auto`` infers it (:func:`infer_scenario`); labels follow cfl's scenarios (task:
    head outputs 0..K-1 with ``Task.classes`` the global ids; class/domain: the benchmark's class ids).
    A test stream of one experience (``ni_benchmark``) is every task's test set (domain scenario only).
    ``default_model``: what ``model.name: auto`` builds (by default from the input shape);
    ``workers``: DataLoader worker processes for benchmarks with costly per-sample transforms.
    """
    if scenario != "auto" and scenario not in SCENARIOS:
        raise ConfigError(f"scenario must be 'auto' or one of {SCENARIOS}, got {scenario!r}")
    for attr in ("train_stream", "test_stream"):
        if not hasattr(benchmark, attr):
            raise _refuse(f"{type(benchmark).__name__} has no {attr}")
    train = [experience_tensors(e, workers) for e in benchmark.train_stream]
    test = [experience_tensors(e, workers) for e in benchmark.test_stream]
    if not train:
        raise _refuse("the benchmark's train_stream is empty")
    class_sets = [sorted(set(y.tolist())) for _, y, _ in train]
    task_labels = [t for _, _, t in train]
    scenario = infer_scenario(task_labels, class_sets) if scenario == "auto" else scenario
    if len(test) == 1 < len(train) and scenario == "domain":
        test = test * len(train)
    if len(test) != len(train):
        raise ConfigError(f"the benchmark has {len(train)} training and {len(test)} test experiences; cfl needs "
                          f"one test experience per training experience (or one shared, in the domain scenario)")
    tasks = []
    for t, ((xtr, ytr, _), (xte, yte, _), classes) in enumerate(zip(train, test, class_sets, strict=True)):
        if scenario == "domain":  # one shared head: labels as they are
            tasks.append(Task(f"exp-{t}", xtr, ytr, xte, yte, classes))
            continue
        classes, mapping = _head_order(benchmark, t, classes, local=scenario == "task")
        tasks.append(Task(f"exp-{t}", xtr, _relabel(ytr, mapping, f"training experience {t}"),
                          xte, _relabel(yte, mapping, f"test experience {t}"), classes))
    heads = max(len(task.classes) if scenario == "task" else int(max(task.train_y.max(), task.test_y.max())) + 1
                for task in tasks)
    shapes = sorted({tuple(x.shape[1:]) for x, _, _ in train + test})
    if len(shapes) != 1:
        raise _refuse(f"the experiences' inputs have different shapes {shapes}; cfl's model takes one shape")
    shape = shapes[0]
    info: dict[str, Any] = {"avalanche_task_labels": task_labels}
    if hasattr(benchmark, "classes_order_original_ids"):
        info["original_class_ids"] = [int(c) for c in benchmark.classes_order_original_ids]
    stream = Stream(name or f"avalanche-{type(benchmark).__name__}", scenario, tasks, heads, shape,
                    default_model or _default_model(shape), info)
    check_stream(stream)  # e.g. integer or float64 inputs: refused here, not in training
    return stream
