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

from cfl.config.schema import ConfigError
from cfl.pretrained.weights_messages import mismatch, resampled_note, wrong_shape

RANDOM = "random"
SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
#: keys of the file's own classifier (ImageNet's 1000 classes): dropped, with a line on stderr (cfl trains its head)
CLASSIFIER_PREFIXES = ("head.", "fc_norm_head.")
#: the entries of a training checkpoint that each hold a whole state dict (timm's ``load_checkpoint`` reads these)
STATE_ENTRIES = ("state_dict", "model", "state_dict_ema", "model_ema")


@dataclass(frozen=True)
class LoadedWeights:
    """What was loaded: the file (None: random), its SHA-256 and the notes said on stderr."""

    path: str | None
    sha256: str | None
    notes: tuple[str, ...] = ()
    #: why the file looks freshly initialised, not trained (None: it does not, or model.weights_trained says it is)
    untrained: str | None = None

    @property
    def random(self) -> bool:
        """An untrained backbone: ``weights: random``, or a file whose statistics are an initialisation's."""
        return self.path is None or self.untrained is not None


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), read in full at each call: no memo keyed by size and modification time, which a
    replaced file of the same size and time would pass (a ViT-B/16 file hashes in about a second)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_path(weights: str) -> Path:
    """``model.weights`` as a path that exists and has a known suffix."""
    if not weights.strip():
        raise ConfigError("'model.weights' is empty; give the path of the backbone's weights file (.safetensors, "
                          ".pth or .npz) or 'random'")
    path = Path(weights).expanduser()
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except (OSError, RuntimeError) as err:
            raise ConfigError(f"'model.weights': '{path}' is a symbolic link that does not lead to a file "
                              f"({type(err).__name__}: {err}; a loop, or a missing target): point it at the weights "
                              f"file, or give the file's own path") from None
    if not path.is_file():
        state = "does not exist" if not path.exists() else "is not a regular file"
        where = "" if path.is_absolute() else (
            f" (a relative model.weights is resolved against the working directory, {Path.cwd()}, not against the "
            "config or sweep file: only a sweep's base: is resolved against the sweep file; run from the folder "
            "the path assumes, or give an absolute path)")
        raise ConfigError(f"'model.weights': the file '{path}' {state}{where}; give a .safetensors, .pth or .npz "
                          f"file of the backbone's weights (docs/pretrained.md says how to get one), or 'random'")
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
    if isinstance(state, dict) and not isinstance(next(iter(state.values()), None), torch.Tensor):
        entries = [k for k in STATE_ENTRIES if isinstance(state.get(k), dict)]
        if len(entries) > 1:
            raise ConfigError(f"'model.weights': '{path}' holds {len(entries)} state dicts ({', '.join(entries)}; "
                              f"timm's loader prefers the EMA one, others take 'model'): save the one you mean alone, "
                              f"e.g. torch.save(checkpoint[{entries[0]!r}], 'weights.pth')")
        if entries:
            state = state[entries[0]]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        what = type(state).__name__ if not isinstance(state, dict) else "a mapping whose values are not all tensors"
        raise ConfigError(f"'model.weights': '{path}' holds {what}, not a state dict of tensors")
    return {str(k).removeprefix("module."): v for k, v in state.items()}


def _check_dtypes(path: Path, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> list[str]:
    """Refuse a tensor that is not floating point where the backbone's is (it would be cast without a word);
    the note for floating tensors of another precision (cast to the backbone's)."""
    for key, value in state.items():
        if key in own and own[key].is_floating_point() and not value.is_floating_point():
            raise ConfigError(f"'model.weights': '{path}': key '{key}' holds {value.dtype} values where the backbone "
                              f"holds {own[key].dtype}: integer weights are no trained backbone's (a quantised or "
                              f"damaged file?); give the floating-point weights file")
    cast = sorted({str(v.dtype) for k, v in state.items() if k in own and v.dtype != own[k].dtype})
    return [f"tensors stored as {', '.join(cast)} are cast to the backbone's float32"] if cast else []


def check_finite(path: Path, model: nn.Module) -> None:
    """Refuse weights holding NaN or inf (timm's fused attention can hide a NaN; an inf poisons the features)."""
    for key, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            nan, inf = int(torch.isnan(value).sum()), int(torch.isinf(value).sum())
            raise ConfigError(f"'model.weights': '{path}': key '{key}' holds {nan} NaN and {inf} infinite values; "
                              f"the file is damaged: give an intact copy of the weights")


def load_into(model: nn.Module, path: Path) -> tuple[str, ...]:
    """Load the file's weights into ``model`` (strict: every key, every shape, floating point and finite); the
    notes for stderr."""
    if path.suffix == ".npz":
        from cfl.pretrained.npz_weights import load_npz

        notes = load_npz(model, path)
        check_finite(path, model)
        return notes
    state = read_state_dict(path)
    dropped = sorted(k for k in state if k.startswith(CLASSIFIER_PREFIXES))
    notes = []
    if dropped:
        shapes = ", ".join(f"{k} {tuple(state[k].shape)}" for k in dropped)
        notes.append(f"the file's own classifier ({shapes}) is not loaded: cfl trains its own head")
        state = {k: v for k, v in state.items() if k not in dropped}
    own = model.state_dict()
    notes += _check_dtypes(path, state, own)
    try:  # timm's filter: older key names, position embeddings resampled to the model's image size
        from timm.models.vision_transformer import checkpoint_filter_fn

        filtered = checkpoint_filter_fn(state, model)
    except Exception:  # noqa: BLE001 - the strict check below names what does not fit
        filtered = state
    if "pos_embed" in state and "pos_embed" in filtered and state["pos_embed"].shape != filtered["pos_embed"].shape:
        notes.append(resampled_note(tuple(state["pos_embed"].shape), tuple(filtered["pos_embed"].shape)))
    missing = sorted(set(own) - set(filtered))
    unexpected = sorted(set(filtered) - set(own))
    if missing or unexpected:
        raise ConfigError(mismatch(path, missing, unexpected))
    for key, value in filtered.items():
        if value.shape != own[key].shape:
            raise ConfigError(wrong_shape(path, key, tuple(value.shape), tuple(own[key].shape)))
    model.load_state_dict(filtered, strict=True)
    check_finite(path, model)
    return tuple(notes)


def untrained_evidence(model: nn.Module) -> str | None:
    """Why ``model``'s weights look freshly initialised (None: they do not): every LayerNorm at its initial weight
    1 and bias 0, which training moves (timm's ViTs start there; their linear weights at a spread of 0.02)."""
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm) and m.weight is not None]
    if not norms or not all(bool((m.weight == 1).all()) and (m.bias is None or not bool(m.bias.any()))
                            for m in norms):
        return None
    linear = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    spread = torch.cat([w.flatten() for w in linear]).std().item() if linear else float("nan")
    return (f"every one of its {len(norms)} LayerNorm layers has weight exactly 1 and bias 0 (their initial "
            f"values), its linear weights' standard deviation is {spread:.4f} (timm initialises them at 0.02)")


def load_weights(model: nn.Module, weights: str, expected_sha256: str | None, quiet: bool = False,
                 trained: bool = False) -> LoadedWeights:
    """``model.weights`` into ``model``: ``random`` leaves it as built; a file is hashed, checked and loaded, and
    flagged untrained when its statistics are an initialisation's (unless ``trained``: model.weights_trained)."""
    if weights == RANDOM:
        if expected_sha256 is not None:
            raise ConfigError("'model.weights_sha256' is set but 'model.weights' is random: there is no file to "
                              "check; remove model.weights_sha256 or give the weights file")
        if trained:
            raise ConfigError("'model.weights_trained' is true but 'model.weights' is random: remove "
                              "model.weights_trained or give the trained weights file")
        return LoadedWeights(None, None)
    path = weights_path(weights)
    digest = check_sha256(path, expected_sha256)
    notes = list(load_into(model, path))
    evidence = untrained_evidence(model)
    if evidence is not None and trained:
        notes.append(f"the file looks freshly initialised ({evidence}); model.weights_trained: true takes it as "
                     f"trained")
        evidence = None
    elif evidence is not None:
        notes.append(f"the file looks freshly initialised, not trained ({evidence}): the run is flagged as a random "
                     f"backbone (results.json random_backbone, '(random backbone)' in every name); set "
                     f"model.weights_trained: true if the file is trained")
    if not quiet:
        for note in notes:
            print(f"model.weights: {note}", file=sys.stderr)
    return LoadedWeights(str(path), digest, tuple(notes), evidence)
