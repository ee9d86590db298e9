"""A tuning table's selection: each method's grid point with the highest final ACC, the note that shows the grid
and the choice, and the check that a tuned table's sweep runs the chosen values.

A *tuning* table (``tuning: true`` in benchmarks/results/tables.yaml) runs each method's grid points (its sweeps'
``variant`` entries, one label each) on tuning seeds. A method's *chosen* point is the one with the highest final
ACC (the mean over the table's seeds), ties going to the first point in the sweep's order; a method is chosen only
once every one of its points has a record for every seed. A point that diverged (a failure record ``failed.json``
for a seed, benchmarks/campaign_failures.py) counts as measured and is never chosen; a method whose every point
diverged gets no chosen value, and says so. A *tuned* table (``tuned_by: TUNING``) runs the chosen
values on the reported seeds: each of its sweeps' variants of a tuned method must set every method parameter the
chosen point sets to the same value (compared after defaults are filled in), which ``campaign.py tables --check``
checks and ``campaign.py run`` and ``tables --write`` require.

    python benchmarks/campaign_tuning.py --table split-fmnist-class-il-tuning   # the note and the lines to paste
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the campaign's sibling modules

from campaign_failures import load_failures, short_cause  # noqa: E402
from campaign_plan import RESULTS_ROOT, ROOT, TABLES_FILE, load_tables  # noqa: E402

from cfl.app.sweep import load_sweep  # noqa: E402
from cfl.config.keys import ConfigError  # noqa: E402


@dataclass
class GridPoint:
    """One variant of a tuning sweep: its label, the method parameters it sets (as the sweep writes them, and
    resolved with the method's defaults), its results and the seeds on which it diverged (each
    ``diverged (exit 3): <short cause>``)."""

    label: str
    written: dict[str, Any]
    method: dict[str, Any]
    accs: list[float] = field(default_factory=list)
    fgts: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seeds: set[int] = field(default_factory=set)

    def value(self, key: str) -> Any:
        return self.method.get(key)


@dataclass
class MethodGrid:
    """A method's grid points in the sweep's order, the parameters they vary and the point kept."""

    method: str
    points: list[GridPoint]
    seeds: int

    @property
    def varied(self) -> list[str]:
        keys = dict.fromkeys(k for p in self.points for k in p.written)
        return [k for k in keys if len({json.dumps(p.value(k)) for p in self.points}) > 1]

    @property
    def recorded(self) -> int:
        """The points measured on every seed: a result or a failure record (diverged) each."""
        return sum(len(p.seeds) == self.seeds for p in self.points)

    @property
    def complete(self) -> bool:
        return self.recorded == len(self.points)

    @property
    def finite(self) -> list[GridPoint]:
        """The points that diverged on no seed: the only ones that can be chosen."""
        return [p for p in self.points if not p.failures]

    @property
    def all_diverged(self) -> bool:
        return self.complete and not self.finite

    @property
    def chosen(self) -> GridPoint | None:
        """The point with the highest mean ACC of those that never diverged, the first in the sweep's order on a
        tie; None until complete, and where every point diverged."""
        if not self.complete or not self.finite:
            return None
        return max(self.finite, key=lambda p: _mean(p.accs))  # max keeps the first of equal keys

    @property
    def edge(self) -> list[str]:
        """The varied numeric parameters whose chosen value is the grid's lowest or highest (a value beyond it was
        not tried, so the best may lie past it); none on a tie of every value."""
        chosen = self.chosen
        if chosen is None or self.all_tie:
            return []
        out = []
        for key in self.varied:
            values = [p.value(key) for p in self.points]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and \
                    chosen.value(key) in (min(values), max(values)):
                out.append(key)
        return out

    @property
    def all_tie(self) -> bool:
        finite = self.finite
        return (self.complete and bool(finite) and len({_mean(p.accs) for p in finite}) == 1
                and (len(finite) > 1 or len(self.points) == 1))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _written_params(variant: dict[str, Any]) -> dict[str, Any]:
    """The method parameters a variant entry sets (``method: {...}`` or ``method.KEY``), its name left out."""
    written: dict[str, Any] = {}
    for key, value in variant.items():
        if key == "method" and isinstance(value, dict):
            written.update(value)
        elif key.startswith("method."):
            written[key.split(".")[1]] = value
    written.pop("name", None)
    return written


def _variants(sweep: Path) -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load(sweep.read_text()) or {}
    variants = (spec.get("grid") or {}).get("variant") or []
    return {str(v["label"]): v for v in variants if isinstance(v, dict) and "label" in v}


def sweep_points(sweep: Path) -> list[GridPoint]:
    """The sweep's variants in its order, each with its resolved method config (the sweep validated)."""
    raw = _variants(sweep)
    points: dict[str, GridPoint] = {}
    for run in load_sweep(sweep, out=ROOT / "runs" / "tuning-check"):  # nothing is written
        label = run.config.label
        if label not in points:
            points[label] = GridPoint(label, _written_params(raw.get(label, {})), dict(run.config.method))
    return list(points.values())


def method_grids(name: str, table: dict[str, Any], records: list[dict[str, Any]],
                 failures: list[dict[str, Any]] = ()) -> list[MethodGrid]:
    """Each method's grid of tuning table ``name`` with the ACC and FGT of its ``records`` and its ``failures``
    (failure records: the point diverged); a record of no grid point, of another seed or made with other
    parameters than its point's is refused (the sweep changed), and so is a result and a failure of one point and
    seed."""
    seeds = table.get("seeds", [0])
    points = [p for sweep in table["sweeps"] for p in sweep_points(ROOT / sweep)]
    by_label = {p.label: p for p in points}
    for record in [*records, *failures]:
        config = record["config"]
        run = record.get("record", {}).get("run", config.get("label"))
        point = by_label.get(config.get("label"))
        if point is None or config.get("seed") not in seeds:
            raise ConfigError(f"tuning table {name}: the record {run} (label {config.get('label')!r}, seed "
                              f"{config.get('seed')}) is no grid point of {', '.join(table['sweeps'])} on seeds "
                              f"{seeds}; move it out of benchmarks/results/{name}/ or restore the sweep")
        differ = [k for k in point.written if config["method"].get(k) != point.value(k)]
        if config["method"].get("name") != point.method["name"] or differ:
            raise ConfigError(f"tuning table {name}: the record {run} was made with {config['method']}, which is not "
                              f"its grid point's {point.method}; re-run it or move it away")
        if config["seed"] in point.seeds:
            raise ConfigError(f"tuning table {name}: grid point {point.label!r} has a result and a failure record "
                              f"(failed.json) for seed {config['seed']}; delete the one that is stale")
        point.seeds.add(config["seed"])
        if record.get("failed"):
            point.failures.append(f"diverged (exit {record['exit_code']}): {short_cause(record['stop'])}")
        else:
            point.accs.append(float(record["acc"]))
            point.fgts.append(float(record["fgt"]))
    methods: dict[str, list[GridPoint]] = {}
    for point in points:
        methods.setdefault(point.method["name"], []).append(point)
    return [MethodGrid(method, pts, len(seeds)) for method, pts in methods.items()]


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else json.dumps(value) if not isinstance(value, str) else value


def _params(point: GridPoint, keys: list[str]) -> str:
    return " ".join(f"{k}={_show(point.value(k))}" for k in keys) or point.label


def selection_note(grids: list[MethodGrid]) -> str:
    """Markdown: per method the grid's values with their ACC / FGT, the chosen one in bold."""
    lines = ["Grid and chosen value (highest final ACC, the mean over the tuning seeds; a tie goes to the first "
             "value in the sweep's order):", "", "| method | grid: value ACC / FGT | chosen |", "|---|---|---|"]
    for grid in grids:
        keys = grid.varied
        cells = []
        for point in grid.points:
            result = (point.failures[0] if point.failures
                      else f"{_mean(point.accs):.2f} / {_mean(point.fgts):.2f}" if len(point.accs) == grid.seeds
                      else "not recorded")
            cell = f"{_params(point, keys)}: {result}"
            cells.append(f"**{cell}**" if point is grid.chosen else cell)
        chosen = grid.chosen
        if grid.all_diverged:
            verdict = "none: every value diverged"
        elif chosen is None:
            verdict = f"none yet ({grid.recorded} of {len(grid.points)} recorded)"
        else:
            tie = " that did not diverge" if len(grid.finite) < len(grid.points) else ""
            verdict = _params(chosen, keys) + (f" (every value{tie} ties on ACC: the first)" if grid.all_tie else "")
            if grid.edge:
                verdict += f" (at the grid's edge in {', '.join(grid.edge)}: a value beyond it was not tried)"
        lines.append(f"| {grid.method} | {'; '.join(cells)} | {verdict} |")
    return "\n".join(lines)


def paste_lines(grids: list[MethodGrid]) -> str:
    """The tuned sweep's variant lines of the chosen points (labelled by method), a comment for the others."""
    lines = []
    for grid in grids:
        chosen = grid.chosen
        if grid.all_diverged:
            lines.append(f"    # {grid.method}: no value chosen: every one of its {len(grid.points)} grid points "
                         "diverged (exit 3); add values the method trains at")
            continue
        if chosen is None:
            lines.append(f"    # {grid.method}: no value chosen yet ({grid.recorded} of {len(grid.points)} grid "
                         "points recorded)")
            continue
        variant = {"label": grid.method, "method": {"name": grid.method, **chosen.written}}
        lines.append("    - " + yaml.safe_dump(variant, default_flow_style=True, sort_keys=False, width=1000).strip())
    return "\n".join(lines)


def _records(results_root: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((results_root / name).rglob("results.json"))]


def _grids(results_root: Path, name: str, table: dict[str, Any]) -> list[MethodGrid]:
    """The grids of tuning table ``name`` from its records and failure records under ``results_root``, or, where
    that holds none of the table (a campaign writing its new records elsewhere: the device check's
    ``--results $OUT/records``), from the repository's committed ones: a tuned table runs what they select."""
    if not (results_root / name).is_dir():
        results_root = RESULTS_ROOT
    return method_grids(name, table, _records(results_root, name), load_failures(results_root, name))


def tuned_sweep_problems(tables: dict[str, dict[str, Any]], results_root: Path, chosen: list[str] | None = None,
                         require_chosen: bool = False) -> list[str]:
    """What makes a tuned table's sweeps differ from what its tuning records select: a variant of a tuned method
    with another value than the chosen one, or a tuned method the sweeps lack. ``require_chosen``: also a method
    whose grid is not complete yet (a tuned run would use a value nothing selected)."""
    problems = []
    for name, table in tables.items():
        tuning = table.get("tuned_by")
        if tuning is None or (chosen is not None and name not in chosen):
            continue
        grids = _grids(results_root, tuning, tables[tuning])
        tuned = [(sweep, p) for sweep in table["sweeps"] for p in sweep_points(ROOT / sweep)]
        for grid in grids:
            best = grid.chosen
            if best is None:
                if require_chosen and grid.all_diverged:
                    problems.append(f"table {name}: {grid.method} has no chosen value: every one of its "
                                    f"{len(grid.points)} grid points of table {tuning} diverged (exit 3); add values "
                                    f"it trains at to that table's sweep and run it, or drop {grid.method} from "
                                    f"{', '.join(table['sweeps'])}")
                elif require_chosen:
                    problems.append(f"table {name}: {grid.method} has no chosen value yet ({grid.recorded} of "
                                    f"{len(grid.points)} grid points of table {tuning} recorded); run that table first")
                continue
            mine = [(sweep, p) for sweep, p in tuned if p.method["name"] == grid.method]
            if not mine:
                problems.append(f"table {name}: its sweeps {', '.join(table['sweeps'])} have no {grid.method} variant; "
                                f"table {tuning} tunes it: add one with the values its records select "
                                f"(`python benchmarks/campaign_tuning.py --table {tuning}`)")
            for sweep, point in mine:
                wrong = [k for k in best.written if point.value(k) != best.value(k)]
                if wrong:
                    want = ", ".join(f"{k}: {_show(best.value(k))}" for k in wrong)
                    has = ", ".join(f"{k}: {_show(point.value(k))}" for k in wrong)
                    problems.append(f"table {name}: {sweep}'s variant {point.label!r} ({grid.method}) sets {has}; "
                                    f"the records of table {tuning} select {want}: write {want} in it "
                                    f"(`python benchmarks/campaign_tuning.py --table {tuning}` prints the lines)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, help="a table with 'tuning: true'")
    parser.add_argument("--tables-file", type=Path, default=TABLES_FILE)
    parser.add_argument("--results", type=Path, default=RESULTS_ROOT, help="where the records are")
    args = parser.parse_args(argv)
    try:
        tables = load_tables(args.tables_file)
        table = tables.get(args.table)
        if table is None or not table.get("tuning"):
            raise ConfigError(f"--table {args.table}: not a tuning table of {args.tables_file} (those: "
                              f"{[n for n, t in tables.items() if t.get('tuning')]})")
        grids = _grids(args.results, args.table, table)
        tuned = [n for n, t in tables.items() if t.get("tuned_by") == args.table]
        problems = tuned_sweep_problems(tables, args.results, tuned)
    except (ConfigError, ValueError, OSError) as err:
        print(f"campaign_tuning: error: {err}", file=sys.stderr)
        return 2
    print(selection_note(grids))
    sweeps = ", ".join(s for n in tuned for s in tables[n]["sweeps"]) or "the tuned sweep"
    print(f"\nThe chosen values as variant lines for {sweeps}:\n{paste_lines(grids)}")
    for problem in problems:
        print(f"campaign_tuning: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
