"""The two type aliases every module shares, a model's named tensors and a method's (nested) state dict, and
the bytes such a payload holds."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: Named tensors of one model (parameters, gradients, updates), as ``named_parameters`` gives them.
Params = dict[str, Tensor]
#: A method's state: tensors, plain numbers and strings, nested in dicts (checkpointed with the run).
State = dict[str, Any]


def nbytes(obj: Any) -> int:
    """Bytes of every tensor inside a (nested) dict/list payload; plain numbers count 4 bytes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if isinstance(obj, (int, float)):
        return 4
    return 0
