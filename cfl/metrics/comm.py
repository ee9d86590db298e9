"""Communication accounting: bytes that cross the network, counted from the tensors themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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


@dataclass
class CommLedger:
    """Running totals of bytes sent by clients (upload) and by the server (download)."""

    upload_bytes: int = 0
    download_bytes: int = 0

    def up(self, n: int) -> None:
        self.upload_bytes += int(n)

    def down(self, n: int) -> None:
        self.download_bytes += int(n)

    def state_dict(self) -> dict[str, int]:
        return {"upload_bytes": self.upload_bytes, "download_bytes": self.download_bytes}

    def load_state_dict(self, data: dict[str, int]) -> None:
        self.upload_bytes, self.download_bytes = int(data["upload_bytes"]), int(data["download_bytes"])
