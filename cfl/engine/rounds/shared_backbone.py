"""The shared frozen backbone changed by a method at a task end (``ServerChange.backbone``).

A pretrained model trained through its adapter (``model.train: prompts | components | lora``) holds its frozen
weights as buffers of the run's template model: one copy, run by every client (never stacked, sent or
checkpointed per client). A method's :class:`cfl.methods.base.BackboneUpdate` adds its ``deltas`` into those
buffers in place, once, so every later round, evaluation and server hook sees the changed backbone. What the
engine does about it (nothing silent):

- each change is said on stderr and kept in ``Progress.backbone_changes`` (``results.json``'s
  ``backbone_changes``: task, method, tensors, values, bytes);
- the checkpoint holds the changed tensors' current values (``backbone``), copied back on resume: bit for bit;
- a client downloads the changed tensors once, at its next sampled round (``Progress.backbone_versions``: the
  number of changes each client has received; a client behind by several changes gets each changed tensor once),
  counted in the round's download bytes and on the ledger line ``shared_backbone``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from cfl.methods.hook_guard import BrokenRule
from cfl.methods.hook_types import BackboneUpdate
from cfl.records.snapshot import Progress
from cfl.tensors import Params

BACKBONE_UPDATE = ("must return None or BackboneUpdate(deltas, params): deltas {frozen backbone buffer name: finite "
                   "float tensor shaped like it}, params {parameter name: tensor shaped and typed like it}")
#: the communication ledger's line of the changed backbone tensors sent to the clients
LINE = "shared_backbone"


class SharedBackbone:
    """The frozen buffers of ``model`` (all but the BatchNorm running statistics ``running``) that a method may
    change, and the ones changed so far."""

    def __init__(self, model: nn.Module, running: Params) -> None:
        self.frozen = {k: b for k, b in model.named_buffers() if k not in running and b.is_floating_point()}
        self.changed: Params = {}  # name -> the buffer itself (what the checkpoint holds)
        #: the model's inputs carry queries computed once from this backbone (cfl/pretrained/queries.py)
        self.packed_queries = getattr(model, "layout", None) is not None

    def check(self, update: Any) -> BackboneUpdate | None:
        """``update`` as the hook must return it (``BrokenRule`` naming the first problem)."""
        if update is None:
            return None
        if not isinstance(update, BackboneUpdate) or not isinstance(update.deltas, dict):
            raise BrokenRule(f"{BACKBONE_UPDATE}; got {type(update).__name__}")
        if update.deltas and self.packed_queries:
            raise BrokenRule("the run's inputs carry the prompt methods' queries, computed once from the frozen "
                             "backbone when the run started (cfl/pretrained/queries.py): a changed backbone would "
                             "leave them stale; change the backbone under model.train lora or all, or return "
                             "deltas {}")
        for name, delta in update.deltas.items():
            if name not in self.frozen:
                known = ", ".join(list(self.frozen)[:4]) or "none: the model has no frozen backbone"
                raise BrokenRule(f"{BACKBONE_UPDATE}; '{name}' is not a frozen buffer of the model (e.g. {known})")
            target = self.frozen[name]
            if not isinstance(delta, torch.Tensor) or delta.shape != target.shape or not delta.is_floating_point():
                got = type(delta).__name__ if not isinstance(delta, torch.Tensor) else \
                    f"a {delta.dtype} tensor of shape {tuple(delta.shape)}"
                raise BrokenRule(f"{BACKBONE_UPDATE}; for '{name}' (shape {tuple(target.shape)}) got {got}")
            if not bool(torch.isfinite(delta).all()):
                raise BrokenRule(f"{BACKBONE_UPDATE}; the delta of '{name}' has NaN or inf values")
        return update

    def apply(self, deltas: Params, method: str, task: int, progress: Progress) -> None:
        """Add ``deltas`` into the shared buffers, record the change and say it on stderr."""
        if not deltas:
            return
        with torch.no_grad():
            for name, delta in deltas.items():
                self.frozen[name].add_(delta.to(self.frozen[name].dtype))
                self.changed[name] = self.frozen[name]
        values = sum(self.frozen[k].numel() for k in deltas)
        size = sum(self.frozen[k].numel() * self.frozen[k].element_size() for k in deltas)
        progress.backbone_changes.append({"task": task, "method": method, "tensors": sorted(deltas),
                                          "values": values, "bytes": size})
        print(f"backbone: method {method} changed {len(deltas)} tensors of the shared frozen backbone at the end of "
              f"task {task} ({values:,} values, e.g. {sorted(deltas)[0]}); each client downloads them once, at its "
              f"next round ({size:,} bytes), and the checkpoint holds them", file=sys.stderr, flush=True)

    def download_bytes(self, clients: list[int], progress: Progress) -> int:
        """Bytes of the changed tensors that ``clients`` (this round's) have not received yet; they have them now."""
        changes = progress.backbone_changes
        if not changes:
            return 0
        total = 0
        for cid in clients:
            seen = progress.backbone_versions.get(str(cid), 0)
            names = {n for change in changes[seen:] for n in change["tensors"]}
            total += sum(self.frozen[n].numel() * self.frozen[n].element_size() for n in names)
            progress.backbone_versions[str(cid)] = len(changes)
        return total

    def load(self, saved: Params) -> None:
        """Put a checkpoint's changed tensors back into the shared buffers (``ValueError`` when they do not fit)."""
        for name, tensor in saved.items():
            if name not in self.frozen or tuple(tensor.shape) != tuple(self.frozen[name].shape):
                raise ValueError(f"the checkpoint's changed backbone tensor '{name}' is not a frozen buffer of this "
                                 "model's shape")
        with torch.no_grad():
            for name, tensor in saved.items():
                self.frozen[name].copy_(tensor)
                self.changed[name] = self.frozen[name]
