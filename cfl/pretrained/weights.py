"""A backbone's weights from a local file (``.safetensors``, ``.pth``/``.pt``/``.bin``, ``.npz``), checked
before any data is loaded: a file that is missing or not weights, a SHA-256 that differs from the config's
``model.weights_sha256``, a missing or unexpected key or a wrong shape is a :class:`ConfigError` (exit 2) naming
the file and the key. ``model.weights: random`` keeps timm's random initialisation (flagged in every output)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cfl.schema import ConfigError

RANDOM = "random"
SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
#: keys of the file's own classifier (ImageNet's 1000 classes): dropped, with a line on stderr (cfl trains its head)
CLASSIFIER_PREFIXES = ("head.", "fc_norm_head.")
_HASHES: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class LoadedWeights:
    """What was loaded: the file (None: random), its SHA-256 and the notes said on stderr."""

    path: str | None
    sha256: str | None
    notes: tuple[str, ...] = ()

    @property
    def random(self) -> bool:
        return self.path is None


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), remembered per (path, size, mtime) in this process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def weights_path(weights: str) -> Path:
    """``model.weights`` as a path that exists and has a known suffix."""
    path = Path(weights).expanduser()
    if not path.is_file():
        state = "does not exist" if not path.exists() else "is not a regular file"
        raise ConfigError(f"'model.weights': the file '{path}' {state}; give a .safetensors, .pth or .npz file of "
                          f"the backbone's weights (docs/pretrained.md says how to get one), or 'random'")
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"'model.weights': '{path}' has the suffix '{path.suffix}'; cfl reads "
                          f"{', '.join(SUFFIXES)}")
    return path


def check_sha256(path: Path, expected: str | None) -> str:
    digest = sha256_of(path)
    if expected is not None and digest != expected.lower():
        raise ConfigError(f"'model.weights': the SHA-256 of '{path}' is {digest}, but 'model.weights_sha256' records "
                          f"{expected}; the file was replaced or damaged: put back the recorded file, or set "
                          f"model.weights_sha256 to the new hash once you trust it")
    return digest


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` or torch file (a ``state_dict``/``model`` entry unwrapped)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any reader failure means: not a weights file
        raise ConfigError(f"'model.weights': '{path}' is not a weights file that cfl can read "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if isinstance(state, dict):
        for wrapper in ("state_dict", "model", "state_dict_ema"):
            if set(state) == {wrapper} or (wrapper in state and isinstance(state[wrapper], dict)
                                           and not isinstance(next(iter(state.values()), None), torch.Tensor)):
                state = state[wrapper]
                break
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        what = type(state).__name__ if not isinstance(state, dict) else "a mapping whose values are not all tensors"
        raise ConfigError(f"'model.weights': '{path}' holds {what}, not a state dict of tensors")
    return {str(k).removeprefix("module."): v for k, v in state.items()}


def load_into(model: nn.Module, path: Path) -> tuple[str, ...]:
    """Load the file's weights into ``model`` (strict: every key, every shape); the notes for stderr."""
    if path.suffix == ".npz":
        try:
            model.load_pretrained(str(path))  # timm's reader of the original big_vision .npz files
        except Exception as err:  # noqa: BLE001 - a key or shape the .npz lacks, or not an .npz
            raise ConfigError(f"'model.weights': '{path}' does not load into the backbone "
                              f"({type(err).__name__}: {err})") from None
        return ()
    state = read_state_dict(path)
    dropped = sorted(k for k in state if k.startswith(CLASSIFIER_PREFIXES))
    notes = []
    if dropped:
        shapes = ", ".join(f"{k} {tuple(state[k].shape)}" for k in dropped)
        notes.append(f"the file's own classifier ({shapes}) is not loaded: cfl trains its own head")
        state = {k: v for k, v in state.items() if k not in dropped}
    try:  # timm's filter: older key names, position embeddings resampled to the model's image size
        from timm.models.vision_transformer import checkpoint_filter_fn

        filtered = checkpoint_filter_fn(state, model)
    except Exception:  # noqa: BLE001 - the strict check below names what does not fit
        filtered = state
    if "pos_embed" in state and "pos_embed" in filtered and state["pos_embed"].shape != filtered["pos_embed"].shape:
        notes.append(f"position embeddings resampled from {tuple(state['pos_embed'].shape)} to "
                     f"{tuple(filtered['pos_embed'].shape)} (model.image_size)")
    own = model.state_dict()
    missing = sorted(set(own) - set(filtered))
    unexpected = sorted(set(filtered) - set(own))
    if missing or unexpected:
        parts = ([f"missing key(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"] if missing else []) \
            + ([f"unexpected key(s) {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}"]
               if unexpected else [])
        raise ConfigError(f"'model.weights': '{path}' does not match the backbone: {'; '.join(parts)}; is it the "
                          f"weights of this architecture (model.name)?")
    for key, value in filtered.items():
        if value.shape != own[key].shape:
            raise ConfigError(f"'model.weights': '{path}': key '{key}' has shape {tuple(value.shape)}, the backbone's "
                              f"is {tuple(own[key].shape)}; is it the weights of this architecture (model.name, "
                              f"model.image_size)?")
    model.load_state_dict(filtered, strict=True)
    return tuple(notes)


def load_weights(model: nn.Module, weights: str, expected_sha256: str | None, quiet: bool = False) -> LoadedWeights:
    """``model.weights`` into ``model``: ``random`` leaves it as built; a file is hashed, checked and loaded."""
    if weights == RANDOM:
        if expected_sha256 is not None:
            raise ConfigError("'model.weights_sha256' is set but 'model.weights' is random: there is no file to "
                              "check; remove model.weights_sha256 or give the weights file")
        return LoadedWeights(None, None)
    path = weights_path(weights)
    digest = check_sha256(path, expected_sha256)
    notes = load_into(model, path)
    if not quiet:
        for note in notes:
            print(f"model.weights: {note}", file=sys.stderr)
    return LoadedWeights(str(path), digest, notes)
