"""Run records (a finished run's ``results.json`` with the commit and machine that made it) and the archive that
carries records and unfinished checkpoints back from a borrowed machine to the next campaign.

A record is the run's own ``results.json`` (accuracy matrix, ACC/FGT/BWT, AIA/FWT, costs, wall time, the resolved
config: already small, the curves stay in ``metrics.jsonl``) plus a ``record`` field: the table, the commit (with
``-dirty`` when ``cfl/`` had uncommitted changes), the machine (CPU model and cores, GPU, torch, Python) and the
time it was recorded. ``cfl report benchmarks/results/<table>`` reads records as it reads run directories. A run
that diverged has a failure record ``failed.json`` instead (benchmarks/campaign_failures.py), with the same
``record`` field; it travels in the archive as a record does.
"""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
#: what of an unfinished run directory travels in the archive: all but the W&B copy and the figures
LEFT_BEHIND = ("wandb", ".cfl.lock")
LEFT_BEHIND_SUFFIXES = (".png", ".pdf", ".svg")


def cpu_model() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict[str, Any]:
    """The machine a run ran on, as a record states it."""
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__,
            "python": platform.python_version()}


def commit() -> str:
    """The checkout's commit, ``-dirty`` when the package's code has uncommitted changes (``unknown`` outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cfl"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def write_record(run_dir: Path, record_dir: Path, table: str, run_name: str, device: str) -> Path:
    """The record of a finished run; refuses an incomplete run (a table never quotes one)."""
    results = json.loads((run_dir / "results.json").read_text())
    if not results.get("complete"):
        raise ValueError(f"{run_dir}: the run is not complete ({results.get('tasks_completed')} of "
                         f"{results.get('num_tasks')} tasks); no record is written")
    results["record"] = record_block(table, run_name, device)
    return write_json(record_dir / "results.json", results)


def record_block(table: str, run_name: str, device: str) -> dict[str, Any]:
    """A record's ``record`` field: the table, the run, the commit and machine that made it, when."""
    return {"table": table, "run": run_name, "commit": commit(), "machine": machine(device),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """``data`` into ``path`` at once (a temporary file renamed): a killed campaign leaves no half record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _travels(path: Path, run_dir: Path) -> bool:
    parts = path.relative_to(run_dir).parts
    return not (parts[0] in LEFT_BEHIND or path.suffix in LEFT_BEHIND_SUFFIXES)


def pack(archive: Path, records: list[tuple[str, Path]], checkpoints: list[tuple[str, Path]]) -> dict[str, int]:
    """One ``.tar.gz`` with ``records/<table>/<run>/results.json`` (or ``failed.json``, a diverged run's failure
    record) and ``checkpoints/<table>/<run>/...`` (an unfinished run directory less its W&B copy and figures);
    returns the counts and the archive's bytes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for arcname, path in records:
            tar.add(path, arcname=f"records/{arcname}/{path.name}")
        for arcname, run_dir in checkpoints:
            for path in sorted(run_dir.rglob("*")):
                if path.is_file() and _travels(path, run_dir):
                    tar.add(path, arcname=f"checkpoints/{arcname}/{path.relative_to(run_dir)}")
        note = json.dumps({"commit": commit(), "machine": machine(), "packed_at": time.time()}).encode()
        info = tarfile.TarInfo("campaign.json")
        info.size = len(note)
        tar.addfile(info, io.BytesIO(note))
    return {"records": len(records), "checkpoints": len(checkpoints), "bytes": archive.stat().st_size}


def unpack(archive: Path, results_root: Path, work: Path) -> dict[str, int]:
    """Records into ``results_root`` (one already there with other contents is refused, never overwritten) and
    checkpoints into the work directory, where the campaign resumes them."""
    counts = {"records": 0, "checkpoints": 0}
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if member.name == "campaign.json":
                continue
            if not member.isfile() or ".." in parts or Path(member.name).is_absolute() or parts[0] not in (
                    "records", "checkpoints"):
                raise ValueError(f"{archive}: unexpected member {member.name!r}; not a campaign archive")
        for member in members:
            parts = Path(member.name).parts
            if parts[0] == "records":
                target = results_root.joinpath(*parts[1:])
                data = tar.extractfile(member).read()
                if target.is_file() and target.read_bytes() != data:
                    raise ValueError(f"{archive}: the record {target} exists with other contents; move one away")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                counts["records"] += 1
            elif parts[0] == "checkpoints":
                target = work.joinpath(*parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                counts["checkpoints"] += member.name.endswith("checkpoint.pt")
    return counts
