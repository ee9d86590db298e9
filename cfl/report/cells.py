"""The cells of a ``cfl report`` table: a column's title, how it reads a group's cell, and which way is better."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cfl.report.groups import Group, Run

#: which way a metric is better: ACC up, FGT down, ...; None: no best (text, counts)
Better = Literal["higher", "lower"] | None


@dataclass(frozen=True)
class Stat:
    """Mean ± std over ``n`` of a group's ``of`` runs, shown with ``digits`` decimals."""

    mean: float
    std: float
    n: int
    of: int
    digits: int

    def text(self, pm: str = " ± ") -> str:
        left_out = f" ({self.n} of {self.of} runs)" if self.n < self.of else ""
        spread = f"{pm}{self.std:.{self.digits}f}" if self.n > 1 else ""  # one run: no std to show
        return f"{self.mean:.{self.digits}f}{spread}{left_out}"

    @property
    def shown_mean(self) -> float:
        """The mean as the table prints it (ties at that precision are ties)."""
        return round(self.mean, self.digits)


Cell = str | Stat | None


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[Group], Cell]
    numeric: bool = False  # cells are Stat (or None, or a text such as "never reached")
    better: Better = None
    #: a result of learning (ACC, FGT, BWT, AIA, FWT): one run's value (None where it has none); only these columns
    #: are bolded and tested against the reference row, never costs (upload, wall time, rounds to a target)
    value: Callable[[Run], float | None] | None = None
