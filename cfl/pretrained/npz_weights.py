"""Google's original ``.npz`` ViT weights (the big_vision and augreg layouts of Dosovitskiy et al., ICLR 2021),
read by timm's loader and checked as cfl checks a state dict: every array of the file read but its classifier,
each copied into a backbone tensor of exactly its shape (timm's ``copy_`` would broadcast a ``(1,)`` bias over
``(768,)``), floating point, every backbone tensor written, a scanned layout (blocks stacked in one array) holding
as many blocks as the backbone, and resampled position embeddings said."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from cfl.config.schema import ConfigError
from cfl.pretrained.weights_messages import mismatch, resampled_note, wrong_shape

#: the file's own classifier (ImageNet's classes; the pre-logits layer of older files): not loaded, and said
CLASSIFIER = ("head/", "pre_logits/")
PREFIXES = ("opt/target/", "params/img/", "params/")


class _Recording(np.lib.npyio.NpzFile):
    """An ``NpzFile`` that remembers which arrays were read."""

    read: set[str]

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


class _Copies(TorchFunctionMode):
    """Each ``copy_`` into a backbone tensor: its key written, the first source whose shape or dtype differs."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names, self.written = names, set()
        self.problem: tuple[str, torch.Tensor, torch.Tensor] | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__name__", "") == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            key = self.names.get(args[0].data_ptr())
            if key is not None:
                self.written.add(key)
                if self.problem is None and (args[1].shape != args[0].shape or not args[1].is_floating_point()):
                    self.problem = (key, args[1], args[0])
        return func(*args, **(kwargs or {}))


def _prefix(files: list[str]) -> str:
    return next((p for p in PREFIXES if f"{p}embedding/kernel" in files), "")


def load_npz(model: nn.Module, path: Path) -> tuple[str, ...]:
    """Load the ``.npz`` file into ``model`` with timm's reader, refusing (``ConfigError``) what it would take
    silently; the notes for stderr."""
    opened: list[_Recording] = []
    original = np.load

    def recording_load(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if isinstance(out, np.lib.npyio.NpzFile):
            out.__class__ = _Recording
            out.read = set()
            opened.append(out)
        return out

    own = model.state_dict()
    copies = _Copies({v.data_ptr(): k for k, v in own.items()})
    np.load = recording_load
    try:
        with copies:
            model.load_pretrained(str(path))  # timm's reader of the original big_vision .npz files
    except Exception as err:  # noqa: BLE001 - a key the .npz lacks, or not an .npz
        raise ConfigError(f"'model.weights': '{path}' does not load into the backbone "
                          f"({type(err).__name__}: {err})") from None
    finally:
        np.load = original
    if copies.problem is not None:
        key, src, dst = copies.problem
        if not src.is_floating_point():
            raise ConfigError(f"'model.weights': '{path}': the array for key '{key}' holds {src.dtype} values where "
                              f"the backbone holds {dst.dtype}: give the floating-point weights file")
        raise ConfigError(wrong_shape(path, key, tuple(src.shape), tuple(dst.shape)))
    files, read = opened[0].files, opened[0].read
    prefix = _prefix(files)
    classifier = sorted(k for k in files if k.startswith(tuple(prefix + c for c in CLASSIFIER)))
    unread = [k for k in files if k not in read and k not in classifier]
    outside = [k for k in unread if not k.startswith(prefix)]
    unexpected = [k for k in unread if k.startswith(prefix)]
    missing = sorted(set(own) - copies.written)
    with original(path, allow_pickle=False) as arrays:
        stacked = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"
        blocks = len(model.blocks)
        if stacked in files and arrays[stacked].shape[0] != blocks:
            raise ConfigError(f"'model.weights': '{path}': key '{stacked}' stacks {arrays[stacked].shape[0]} blocks, "
                              f"the backbone has {blocks}; is it the weights of this architecture (model.name)?")
        if missing or unexpected:
            raise ConfigError(mismatch(path, missing, unexpected))
        notes = []
        if classifier:
            shapes = ", ".join(f"{k} {tuple(arrays[k].shape)}" for k in classifier)
            notes.append(f"the file's own classifier ({shapes}) is not loaded: cfl trains its own head")
        pos = next((k for k in (f"{prefix}pos_embedding", f"{prefix}Transformer/posembed_input/pos_embedding")
                    if k in files), None)
        if pos is not None and tuple(arrays[pos].shape) != tuple(model.pos_embed.shape):
            notes.append(resampled_note(tuple(arrays[pos].shape), tuple(model.pos_embed.shape)))
    if outside:
        notes.append(f"{len(outside)} arrays outside '{prefix}' (e.g. {outside[0]}: an optimiser's state) are not "
                     f"weights and are not loaded")
    return tuple(notes)
