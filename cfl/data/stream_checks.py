"""The one check every stream passes before a run uses it, whatever built it: a registered stream's builder
(the dataset readers and their tensor cache included), an Avalanche benchmark (``from_avalanche``) or a
:class:`Stream` given to ``cfl.run(stream=...)``.

Inputs must be finite ``float32`` tensors of the stream's input shape; labels ``int64`` (or ``int32``)
class ids in ``0..classes_per_head-1``, as many as inputs; in the class-incremental scenario every label of
a task is among the classes of that task and the tasks before it (``Task.classes``). Integer inputs
(e.g. uint8 pixels) are refused, not converted: their scale and normalisation are the stream author's
choice. Each problem is a :class:`ConfigError` (exit code 2) naming the stream, the task, the tensor, what
is wrong and the fix, raised before any run file is written. Cost: one ``aminmax`` pass per tensor
(about 27 ms per task of 70,000 784-value inputs on one core).
"""

from __future__ import annotations

import torch

from cfl.config.schema import ConfigError
from cfl.data.stream import Stream, Task

LABEL_DTYPES = (torch.int64, torch.int32)  # the index dtypes the engine's gathers take


def check_stream(stream: Stream) -> None:
    """Refuse a stream whose tensors the engine cannot train on or would score wrongly (module doc)."""
    if not stream.tasks:
        raise ConfigError(f"stream '{stream.name}' has no tasks; give it at least one Task")
    for t, task in enumerate(stream.tasks):
        where = f"stream '{stream.name}', task {t} ('{task.name}')"
        for split in ("train", "test"):
            problem = _split_problem(stream, t, task, split)
            if problem:
                raise ConfigError(f"{where}: {problem}")


def _split_problem(stream: Stream, t: int, task: Task, split: str) -> str | None:
    x, y = getattr(task, f"{split}_x"), getattr(task, f"{split}_y")
    xn, yn = f"{split}_x", f"{split}_y"
    for name, value in ((xn, x), (yn, y)):
        if not isinstance(value, torch.Tensor):
            return f"{name} is a {type(value).__name__}, not a torch tensor; convert it, e.g. torch.as_tensor(...)"
    return _inputs_problem(stream, xn, x) or _labels_problem(stream, t, yn, y, len(x))


def _inputs_problem(stream: Stream, name: str, x: torch.Tensor) -> str | None:
    shape = tuple(stream.input_shape)
    if tuple(x.shape[1:]) != shape or x.dim() != len(shape) + 1:
        return (f"{name} has shape {tuple(x.shape)}, expected (N, {', '.join(map(str, shape))}) (the stream's "
                f"input_shape {shape}); reshape it or fix input_shape")
    if len(x) == 0:
        return f"{name} holds no samples; every task needs training and test samples"
    if x.dtype != torch.float32:
        if x.is_floating_point():
            return f"{name} is {x.dtype}, expected torch.float32 (the model's dtype); convert it with x.float()"
        return (f"{name} holds integers ({x.dtype}), expected torch.float32 inputs; cfl does not guess their scale: "
                f"convert and normalise them yourself, e.g. x.float().div(255) for 8-bit pixels")
    low, high = torch.aminmax(x)
    if not (bool(torch.isfinite(low)) and bool(torch.isfinite(high))):
        count = int((~torch.isfinite(x)).sum())
        return f"{name} holds {count} non-finite values (NaN or inf); replace or drop those samples"
    return None


def _labels_problem(stream: Stream, t: int, name: str, y: torch.Tensor, count: int) -> str | None:
    heads = stream.classes_per_head
    if y.dim() != 1:
        return f"{name} has shape {tuple(y.shape)}; give one class id per input, a vector of length {count}"
    if len(y) != count:
        return f"{name} holds {len(y)} labels for {count} inputs; give one class id per input"
    if y.dtype not in LABEL_DTYPES:
        kind = "floats (regression targets?)" if y.is_floating_point() else f"{y.dtype}"
        return (f"{name} holds {kind}, expected class ids of dtype torch.int64; convert them with y.long() "
                f"(cfl trains classifiers)")
    low, high = (int(v) for v in torch.aminmax(y))
    if low < 0 or high >= heads:
        return (f"{name} holds labels {low}..{high}, expected 0..{heads - 1} (classes_per_head {heads}, "
                f"{stream.scenario} scenario); relabel them into that range, or raise classes_per_head")
    if stream.scenario == "class":
        return _unseen_classes(stream, t, name, y)
    return None


def _unseen_classes(stream: Stream, t: int, name: str, y: torch.Tensor) -> str | None:
    """Class-incremental: the head's outputs for task t are the classes of tasks 0..t."""
    heads = stream.classes_per_head
    for task in stream.tasks[: t + 1]:
        bad = [c for c in task.classes if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < heads]
        if bad:
            return (f"Task.classes of task '{task.name}' holds {bad[:5]}, expected class ids in 0..{heads - 1}; "
                    f"fix Task.classes")
    seen = stream.class_mask(t).to(y.device)
    unseen = y[~seen[y]]
    if len(unseen):
        return (f"{name} holds labels {sorted(set(unseen.tolist()))[:10]} that are not among the classes of tasks "
                f"0..{t} (Task.classes): the class-incremental head masks them out; list them in Task.classes")
    return None
