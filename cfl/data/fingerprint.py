"""A stream's data fingerprint: per task its name, sizes and a BLAKE2b hash of its tensors' bytes.

Kept in every checkpoint, so that resuming a run on other data (another ``data_root``, a replaced file)
is refused instead of silently training on it. Tasks are hashed in parallel threads (``hashlib`` releases
the GIL on large buffers).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from cfl.data.stream import Stream, Task

DIGEST_BYTES = 16
INFO_KEY = "fingerprint"


def tensor_digest(tensors: list[torch.Tensor]) -> str:
    """BLAKE2b of each tensor's dtype, shape and bytes, in order (CPU copies of device tensors)."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(memoryview(t.view(torch.uint8).view(-1).numpy()) if t.numel() else b"")
    return h.hexdigest()


def task_fingerprint(task: Task) -> dict[str, Any]:
    return {"name": task.name, "train": len(task.train_y), "test": len(task.test_y),
            "hash": tensor_digest([task.train_x, task.train_y, task.test_x, task.test_y])}


def fingerprint(stream: Stream) -> list[dict[str, Any]]:
    """The stream's fingerprint (plain data: one dict per task), computed once and kept in ``stream.info``."""
    if INFO_KEY not in stream.info:
        workers = max(1, min(len(stream.tasks), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            stream.info[INFO_KEY] = list(pool.map(task_fingerprint, stream.tasks))
    return stream.info[INFO_KEY]


def _describe(task: dict[str, Any] | None) -> str:
    if task is None:
        return "no such task"
    return f"'{task['name']}', {task['train']} train / {task['test']} test samples, hash {task['hash'][:12]}"


def differences(saved: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """One line per task whose fingerprint differs: what the checkpoint holds, and what the data gives now."""
    out = []
    for t in range(max(len(saved), len(now))):
        old = saved[t] if t < len(saved) else None
        new = now[t] if t < len(now) else None
        if old != new:
            out.append(f"task {t}: {_describe(old)} in the checkpoint, {_describe(new)} now")
    return out
