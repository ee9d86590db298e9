"""Communication accounting: bytes that cross the network, counted from the tensors themselves
(:func:`cfl.tensors.nbytes`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CommLedger:
    """Running totals of bytes sent by clients (upload) and by the server (download).

    ``lines`` keeps named parts of those totals apart (e.g. ``task_end_model.ewc``: the final global
    models sent to EWC's clients at task ends) so that tables can show them as their own line.
    """

    upload_bytes: int = 0
    download_bytes: int = 0
    lines: dict[str, int] = field(default_factory=dict)

    def up(self, n: int) -> None:
        self.upload_bytes += int(n)

    def down(self, n: int, line: str | None = None) -> None:
        self.download_bytes += int(n)
        if line is not None:
            self.lines[line] = self.lines.get(line, 0) + int(n)

    def state_dict(self) -> dict[str, object]:
        return {"upload_bytes": self.upload_bytes, "download_bytes": self.download_bytes, "lines": dict(self.lines)}

    def load_state_dict(self, data: dict[str, object]) -> None:
        self.upload_bytes, self.download_bytes = int(data["upload_bytes"]), int(data["download_bytes"])
        self.lines = {k: int(v) for k, v in data.get("lines", {}).items()}


def task_end_model_line(method: str) -> str:
    """The ledger line of the final global models a method's clients download at task ends."""
    return f"task_end_model.{method}"


def task_start_line(method: str) -> str:
    """The ledger line of a method's ``"task_start"`` broadcast (once per client and task)."""
    return f"task_start.{method}"
