"""What ``/proc/cpuinfo`` says of this CPU: its feature flags and its model name."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpuinfo_values(field_names: tuple[str, ...], cpuinfo: Path = CPUINFO) -> list[str] | None:
    """The values of the ``field_names`` lines of ``cpuinfo`` in file order, or None where it cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    values = []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in field_names:
            values.append(value.strip())
    return values


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``), or None where the file cannot be read."""
    values = cpuinfo_values(("flags", "Features"), cpuinfo)
    return None if values is None else {flag for value in values for flag in value.split()}


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (x86 ``model name``, else Arm's ``CPU part``), else what :mod:`platform` says."""
    for field in ("model name", "Hardware", "CPU part"):
        values = cpuinfo_values((field,), cpuinfo)
        if values:
            return values[0]
    return platform.processor() or platform.machine() or "unknown CPU"
