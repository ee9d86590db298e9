"""The runs each evidence table needs (``benchmarks/results/tables.yaml``) and which of them are done.

A table names sweep files, the seeds (replacing the sweeps' own), optionally the variant labels to keep and the
columns of its table (``cfl report --columns`` keys; default :data:`campaign_tables.COLUMNS`); its
runs are the sweeps' runs in table order, then seed, then the sweep's variant order, so that a campaign cut off
anywhere has finished whole seeds of whole tables first. A run is *recorded* when its record exists under
``benchmarks/results/<table>/<run name>/results.json``, *failed* when a failure record ``failed.json`` is there
instead (it diverged: benchmarks/campaign_failures.py; not rerun until that file is deleted), *checkpointed* when
its run directory in the campaign's work directory holds a checkpoint of the same config (it resumes there), else
*to do*. A recorded or failed run is *done*. A table's ``last`` labels (its costliest rows, e.g. GLFC's proxy
server) wait until every other run of the chosen tables has been taken, so the cheaper rows of all tables land first.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/campaign.py` from anywhere: import the checkout's cfl
    sys.path.insert(0, str(ROOT))

from campaign_published import check_published  # noqa: E402

from cfl.app.sweep import is_complete, load_sweep, resumable  # noqa: E402
from cfl.config.keys import Config, ConfigError  # noqa: E402
from cfl.config.yaml_files import set_dotted  # noqa: E402

TABLES_FILE = ROOT / "benchmarks" / "results" / "tables.yaml"
RESULTS_ROOT = ROOT / "benchmarks" / "results"
TABLE_KEYS = {"title", "sweeps", "seeds", "only", "last", "order", "columns", "tuning", "tuned_by", "published"}


@dataclass(frozen=True, eq=False)  # hashed by identity: a campaign keys its processes by run
class PlannedRun:
    """One run of a table: its sweep run name, resolved config, and where its run directory and record go."""

    table: str
    name: str
    config: Config
    run_dir: Path
    record_dir: Path

    @property
    def recorded(self) -> bool:
        return (self.record_dir / "results.json").is_file()

    @property
    def failed(self) -> bool:
        return (self.record_dir / "failed.json").is_file()

    @property
    def done(self) -> bool:
        """Recorded, or failed (diverged): a campaign does not run it again."""
        return self.recorded or self.failed

    @property
    def checkpointed(self) -> bool:
        return resumable(self.config, self.run_dir)[0]

    @property
    def finished(self) -> bool:
        return is_complete(self.run_dir)

    @property
    def state(self) -> str:
        if self.recorded or self.failed:
            return "recorded" if self.recorded else "failed"
        return "checkpointed" if self.checkpointed else "to do"


def load_tables(path: Path = TABLES_FILE) -> dict[str, dict[str, Any]]:
    """The tables file, checked: every table has sweeps that exist, a list of int seeds, known keys only."""
    try:
        spec = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read the tables file {path}: {err}") from None
    tables = spec.get("tables") if isinstance(spec, dict) else None
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{path}: expected a mapping 'tables: {{NAME: {{sweeps: [...], seeds: [...]}}}}'")
    for name, table in tables.items():
        if not isinstance(table, dict) or not isinstance(table.get("sweeps"), list) or not table["sweeps"]:
            raise ConfigError(f"{path}: table {name!r} needs 'sweeps', a non-empty list of sweep files")
        unknown = set(table) - TABLE_KEYS
        if unknown:
            raise ConfigError(f"{path}: table {name!r} has unknown key(s) {sorted(unknown)}; allowed: "
                              f"{sorted(TABLE_KEYS)}")
        seeds = table.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
            raise ConfigError(f"{path}: table {name!r}: 'seeds' must be a non-empty list of integers, got {seeds!r}")
        _check_columns(path, name, table.get("columns"))
        check_published(path, name, table.get("published"))
        for sweep in table["sweeps"]:
            if not (ROOT / sweep).is_file():
                raise ConfigError(f"{path}: table {name!r} names the sweep file {sweep}, which does not exist")
        if "tuning" in table and type(table["tuning"]) is not bool:
            raise ConfigError(f"{path}: table {name!r}: 'tuning' must be true or false, got {table['tuning']!r}")
        tuning = table.get("tuned_by")
        if tuning is not None and not (isinstance(tables.get(tuning), dict) and tables[tuning].get("tuning") is True):
            raise ConfigError(f"{path}: table {name!r}: 'tuned_by' must name a table of the file with 'tuning: true' "
                              f"(benchmarks/campaign_tuning.py), got {tuning!r}")
    return tables


def _check_columns(path: Path, name: str, columns: Any) -> None:
    """A table's ``columns`` (optional): a non-empty list of ``cfl report --columns`` keys."""
    from cfl.report.table import TableOptions

    if columns is None:
        return
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise ConfigError(f"{path}: table {name!r}: 'columns' must be a list of cfl report column keys, got "
                          f"{columns!r}")
    try:
        TableOptions(columns=tuple(columns)).check("md")
    except ConfigError as err:
        raise ConfigError(f"{path}: table {name!r}: {err}") from None


def _derived_sweep(sweep: Path, seeds: list[int], extra: dict[str, Any], into: Path) -> Path:
    """The sweep file with the table's seeds and the campaign's extra keys (``--set device=cuda``), its base
    made absolute, written into the work directory (the original is never changed)."""
    spec = yaml.safe_load(sweep.read_text())
    base = spec.get("base")
    if isinstance(base, str) and not Path(base).is_absolute():
        spec["base"] = str((sweep.parent / base).resolve())
    spec.setdefault("grid", {})["seed"] = list(seeds)
    spec["set"] = {**(spec.get("set") or {}), **extra}
    spec.pop("out", None)
    into.mkdir(parents=True, exist_ok=True)
    path = into / f".{sweep.stem}.sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def table_runs(name: str, table: dict[str, Any], work: Path, results_root: Path = RESULTS_ROOT,
               extra: dict[str, Any] | None = None) -> list[PlannedRun]:
    """The runs of one table, in campaign order (seed first, then the sweeps' order). A ``model.weights`` file
    is not opened here (weights are not committed: a clean clone plans and checks records without them);
    :func:`without_weights` says which runs lack theirs, and each run's ``cfl run`` checks its file."""
    seeds = table.get("seeds", [0])
    only = table.get("only")
    runs: list[PlannedRun] = []
    for sweep in table["sweeps"]:
        derived = _derived_sweep(ROOT / sweep, seeds, extra or {}, work / name)
        for run in load_sweep(derived, out=work / name, read_weights=False):
            if only is not None and run.config.label not in only:
                continue
            runs.append(PlannedRun(name, run.name, run.config, run.out, results_root / name / run.name))
    for key in ("only", "last"):
        missing = sorted(set(table.get(key) or []) - {r.config.label for r in runs})
        if missing:
            raise ConfigError(f"table {name!r}: {key!r} names {missing}, which no variant of its sweeps has")
    return sorted(runs, key=lambda r: r.config.seed)  # stable: the sweeps' order within a seed


def planned_runs(tables: dict[str, dict[str, Any]], work: Path, results_root: Path = RESULTS_ROOT,
                 extra: dict[str, Any] | None = None, chosen: list[str] | None = None) -> list[PlannedRun]:
    """Every run of the ``chosen`` tables (all: None), tables in the file's order."""
    unknown = sorted(set(chosen or []) - set(tables))
    if unknown:
        raise ConfigError(f"--table: unknown table(s) {unknown}; the tables are {list(tables)}")
    names = [n for n in tables if chosen is None or n in chosen]
    runs = [run for n in names for run in table_runs(n, tables[n], work, results_root, extra)]
    return sorted(runs, key=lambda r: r.config.label in (tables[r.table].get("last") or []))  # stable


def without_weights(runs: list[PlannedRun]) -> dict[str, str]:
    """Per table: the ``model.weights`` file that its runs not yet done name and that is not a file (a relative
    path read against the repository root, where the campaign starts each ``cfl run``)."""
    missing: dict[str, str] = {}
    for run in runs:
        weights = run.config.model.weights
        if run.done or weights in (None, "random"):
            continue
        path = Path(weights).expanduser()
        if not (path if path.is_absolute() else ROOT / path).is_file():
            missing.setdefault(run.table, weights)
    return missing


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set key=value`` pairs, values read as YAML (as ``cfl run --set`` reads them)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set device=cuda")
        out[key] = yaml.safe_load(value)
    probe: dict[str, Any] = {}
    for key, value in out.items():
        set_dotted(probe, key, value)
    return out


def plan_text(runs: list[PlannedRun], next_count: int = 5) -> str:
    """Per table: its runs recorded / checkpointed / to do / failed; then the next runs a campaign would take."""
    lines = []
    for table in dict.fromkeys(r.table for r in runs):
        mine = [r for r in runs if r.table == table]
        counts = {s: sum(r.state == s for r in mine) for s in ("recorded", "checkpointed", "to do", "failed")}
        hint = " (diverged, not rerun: delete a run's failed.json to retry it)" if counts["failed"] else ""
        lines.append(f"{table}: {len(mine)} runs, " + ", ".join(f"{v} {k}" for k, v in counts.items()) + hint)
    todo = [r for r in runs if not r.done]
    lines.append(f"next: {', '.join(f'{r.table}/{r.name} ({r.state})' for r in todo[:next_count]) or 'nothing'}")
    return "\n".join(lines)


def config_yaml(config: Config) -> str:
    """A config as a YAML file ``cfl run`` reads back to the same config."""
    return yaml.safe_dump(json.loads(json.dumps(config.to_dict())), sort_keys=False)
