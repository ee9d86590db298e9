"""The messages of a weights file that does not fit its backbone, shared by every format's reader."""

from __future__ import annotations

from pathlib import Path


def resampled_note(before: tuple[int, ...], after: tuple[int, ...]) -> str:
    return f"position embeddings resampled from {before} to {after} (model.image_size)"


def mismatch(path: Path, missing: list[str], unexpected: list[str]) -> str:
    parts = ([f"missing key(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"] if missing else []) \
        + ([f"unexpected key(s) {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}"]
           if unexpected else [])
    return (f"'model.weights': '{path}' does not match the backbone: {'; '.join(parts)}; is it the weights of this "
            f"architecture (model.name)?")


def wrong_shape(path: Path, key: str, got: tuple[int, ...], own: tuple[int, ...]) -> str:
    return (f"'model.weights': '{path}': key '{key}' has shape {got}, the backbone's is {own}; is it the weights of "
            f"this architecture (model.name, model.image_size)?")
