"""The two type aliases every module shares: a model's named tensors and a method's (nested) state dict."""

from __future__ import annotations

from typing import Any

from torch import Tensor

#: Named tensors of one model (parameters, gradients, updates), as ``named_parameters`` gives them.
Params = dict[str, Tensor]
#: A method's state: tensors, plain numbers and strings, nested in dicts (checkpointed with the run).
State = dict[str, Any]
