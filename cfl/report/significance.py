"""Paired tests across seeds between each row of a ``cfl report`` table and a reference row (``--reference``).

Within each stream and partition, every row is compared with the reference row of that block (default: the
FedAvg row, when the block has exactly one), in each result column (ACC, FGT, BWT, AIA, FWT; never costs): the
runs are paired by seed (the seeds both rows have a value for) and tested two-sided with

- ``t``: the paired t-test, ``scipy.stats.ttest_rel`` (needs 2 pairs); identical values in every pair
  give p = 1 (no difference to test), a constant non-zero difference p = 0;
- ``wilcoxon``: the Wilcoxon signed-rank test, ``scipy.stats.wilcoxon`` (exact for small n; needs 6 pairs, as
  with 5 or fewer its smallest two-sided p is 2/2^5 = 0.0625 and no row could be marked).

A cell whose p is below :data:`ALPHA` is marked with a dagger (Markdown and LaTeX) and a note under the table
names the test, the reference and the level; the CSV has each p-value in a column of its own.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from cfl.config.keys import ConfigError
from cfl.report.cells import Column
from cfl.report.groups import Group
from cfl.report.row_order import matches

ALPHA = 0.05
TESTS = {"t": "paired t-test (scipy.stats.ttest_rel)", "wilcoxon": "Wilcoxon signed-rank test (scipy.stats.wilcoxon)"}
MIN_PAIRS = {"t": 2, "wilcoxon": 6}
DEFAULT_REFERENCE = "fedavg"
DAGGER = "†"


@dataclass(frozen=True)
class Paired:
    """A row's test against its reference in one column: p-value (None: too few pairs) over ``n`` seed pairs."""

    p: float | None
    n: int

    @property
    def marked(self) -> bool:
        return self.p is not None and self.p < ALPHA


def paired_p(reference: dict[int, float], row: dict[int, float], test: str = "t") -> Paired:
    """The two-sided p-value of ``test`` on the values of the seeds both have (None below its minimum pairs)."""
    from scipy import stats

    seeds = sorted(set(reference) & set(row))
    a, b = [row[s] for s in seeds], [reference[s] for s in seeds]
    if len(seeds) < MIN_PAIRS[test]:
        return Paired(None, len(seeds))
    differences = [x - y for x, y in zip(a, b, strict=True)]
    if all(d == 0 for d in differences):
        return Paired(1.0, len(seeds))
    if len(set(differences)) == 1 and test == "t":  # no spread: the t statistic is infinite
        return Paired(0.0, len(seeds))
    p = float(stats.ttest_rel(a, b).pvalue if test == "t" else stats.wilcoxon(a, b).pvalue)
    return Paired(p if math.isfinite(p) else None, len(seeds))


def by_seed(col: Column, group: Group) -> dict[int, float]:
    assert col.value is not None
    values = {run.seed: col.value(run) for run in group.runs}
    return {seed: v for seed, v in values.items() if v is not None}


@dataclass(frozen=True)
class Significance:
    """The tests of a table: per (row index, column index) the :class:`Paired`; ``references`` the reference row
    of each stream and partition."""

    test: str
    reference: str
    references: dict[tuple[str, str], int]
    results: dict[tuple[int, int], Paired]

    def marked(self, row: int, col: int) -> bool:
        found = self.results.get((row, col))
        return found is not None and found.marked

    @property
    def ran(self) -> bool:
        return any(p.p is not None for p in self.results.values())

    def describe(self, row: int, groups: list[Group]) -> str:
        """The CSV's ``significance`` cell: ``reference``, the test with its reference and pairs, or empty."""
        if row in self.references.values():
            return "reference"
        pairs = [p.n for (i, _), p in self.results.items() if i == row and p.p is not None]
        if not pairs:
            return ""
        ref = groups[self.references[(groups[row].stream, groups[row].partition)]]
        return f"{TESTS[self.test]} against {ref.label}, {max(pairs)} seeds paired"

    def note(self) -> str:
        return (f"{DAGGER} differs from the {self.reference} row of its stream and partition at p < {ALPHA:g}: "
                f"two-sided {TESTS[self.test]}, paired by seed{self.few_pairs_note()}")

    def few_pairs_note(self) -> str:
        """What the table's note adds when a mark rests on fewer than :data:`FEW_PAIRS` seed pairs (the warning
        on stderr names each; the note travels with a table pasted elsewhere), else ""."""
        few = sorted({p.n for p in self.results.values() if p.marked and p.n < FEW_PAIRS})
        if not few:
            return ""
        return (f"; a mark on {' or '.join(map(str, few))} seeds rests on a test of {few[0] - 1} degree(s) of "
                "freedom, which a near-constant difference passes whatever its size: weak evidence, add seeds")


def reference_rows(groups: list[Group], reference: str | None) -> dict[tuple[str, str], int]:
    """Per stream and partition, the index of its reference row; a ``reference`` given that matches no row, or
    several rows of one block, is refused; the default (FedAvg) is skipped, with a note, where it is ambiguous."""
    name = reference or DEFAULT_REFERENCE
    found: dict[tuple[str, str], list[int]] = {}
    for i, g in enumerate(groups):
        if matches(name, g):
            found.setdefault((g.stream, g.partition), []).append(i)
    if reference is not None and not found:
        raise ConfigError(f"--reference {reference!r} matches no row; name a method "
                          f"({', '.join(sorted({g.method for g in groups}))}) or a whole row label")
    several = {block: rows for block, rows in found.items() if len(rows) > 1}
    for (stream, partition), rows in several.items():
        labels = ", ".join(groups[i].label for i in rows)
        if reference is not None:
            raise ConfigError(f"--reference {reference!r} matches {len(rows)} rows of {stream} {partition} ({labels});"
                              " name one whole row label")
        print(f"cfl: note: no significance tests in {stream} {partition}: {len(rows)} rows are {name} ({labels}); "
              "choose one with --reference LABEL", file=sys.stderr)
    return {block: rows[0] for block, rows in found.items() if len(rows) == 1}


def significance(cols: list[Column], groups: list[Group], reference: str | None = None,
                 test: str = "t") -> Significance:
    """Every row's test against its block's reference row in every result column."""
    if test not in TESTS:
        raise ConfigError(f"--test must be one of {', '.join(TESTS)}, got {test!r}")
    refs = reference_rows(groups, reference)
    results: dict[tuple[int, int], Paired] = {}
    for i, g in enumerate(groups):
        ref = refs.get((g.stream, g.partition))
        if ref is None or ref == i:
            continue
        for k, col in enumerate(cols):
            if col.value is not None:
                results[(i, k)] = paired_p(by_seed(col, groups[ref]), by_seed(col, g), test)
    name = reference or DEFAULT_REFERENCE
    warn_few_pairs(results, groups, cols)
    return Significance(test, name, refs, results)


#: fewer seed pairs than this behind a mark is warned about (2 pairs: one degree of freedom)
FEW_PAIRS = 3


def warn_few_pairs(results: dict[tuple[int, int], Paired], groups: list[Group], cols: list[Column]) -> None:
    """A warning on stderr for each mark that rests on fewer than :data:`FEW_PAIRS` seed pairs."""
    for (i, k), paired in sorted(results.items()):
        if paired.marked and paired.n < FEW_PAIRS:
            print(f"cfl: warning: {DAGGER} on {groups[i].label} {cols[k].title} rests on {paired.n} seeds (a paired "
                  f"test of {paired.n} pairs has {paired.n - 1} degree(s) of freedom: a near-constant difference "
                  "marks it whatever its size); read it as weak evidence, or add seeds", file=sys.stderr)
