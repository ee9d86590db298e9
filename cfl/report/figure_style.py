"""How comparison figures look: a qualitative palette with markers and line styles, fitted accuracy axes, and
the options of ``cfl report --plots`` (``--plot-style FILE``, ``--plot-format``, ``--y-range``, ``--figure-size``).

A style file (YAML; every key optional)::

    groups:                   # these groups only, in this order (the others are left out, and named)
      - group: fedavg         # a group as the report names it (the table's method column, the CSVs' group)
        label: FedAvg         # its legend text (default: display name plus the settings that differ)
        color: "#1f77b4"      # any matplotlib colour (default: its place in the palette)
    y_range: [60, 100]        # the accuracy axes (default: fitted to the data); `full`: 0-100 with a margin
    size: [7, 4]              # width and height of each figure in inches, 1 to 100 (default: fitted to the legend)
    formats: [pdf, svg]       # written beside each PNG

Everything is checked before any figure is drawn; a bad value is refused (exit 2) naming the key and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cfl.config.schema import ConfigError
from cfl.drawable import check_label, check_size

#: twelve filled markers, each distinct in shape
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")
LINESTYLES = ("-", "--", "-.", ":")
#: what a figure may also be saved as (PNG is always written)
FORMATS = ("pdf", "svg")
STYLE_KEYS = ("groups", "y_range", "size", "formats")
#: ``--facet``: a panel per setting that differs (auto), per stream (with its scenario), per partition, or one panel
FACETS = ("auto", "none", "stream", "partition")
GROUP_KEYS = ("group", "label", "color")
#: ``y_range: full``: 0-100 with a margin, so a curve at 100 % is not drawn on the frame
FULL_RANGE = (-2.0, 102.0)


@dataclass(frozen=True)
class Look:
    """How one group is drawn: colour, marker and line style."""

    color: Any
    marker: str
    linestyle: str


def looks(n: int) -> list[Look]:
    """``n`` looks from a qualitative palette: tab10's ten colours, then their ten light tints, each with its own
    marker (12 shapes) and line style (4), so that neighbours differ in colour, marker and line style and no two
    of the first 20 share a colour."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    colors = [tab20(2 * i) for i in range(10)] + [tab20(2 * i + 1) for i in range(10)]
    return [Look(colors[i % 20], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)]) for i in range(n)]


@dataclass(frozen=True)
class GroupStyle:
    group: str
    label: str | None = None
    color: Any = None


@dataclass(frozen=True)
class FigureOptions:
    """What ``cfl report --plots`` was asked for (module docstring); the defaults fit everything to the data.
    ``order``: the table's ``--order`` (legend order = row order); ``facet``: :data:`FACETS`; ``title``: None (no
    title: the caption goes to the sidecar ``NAME.txt``), ``""`` (the caption as title) or a text;
    ``last_k``: :mod:`cfl.report.last_k`."""

    groups: tuple[GroupStyle, ...] | None = None
    y_range: tuple[float, float] | None = None
    size: tuple[float, float] | None = None
    formats: tuple[str, ...] = field(default=())
    order: tuple[str, ...] | None = None
    facet: str = "auto"
    title: str | None = None
    last_k: int | None = None

    def with_report(self, order: tuple[str, ...] | None = None, facet: str | None = None, title: str | None = None,
                    last_k: int | None = None) -> FigureOptions:
        """These options with the report command's row order, facets, title and last-k."""
        if facet is not None and facet not in FACETS:
            raise ConfigError(f"--facet must be one of {', '.join(FACETS)}, got {facet!r}")
        if title is not None:
            check_label(title, "--title")
        return replace(self, order=order, facet=facet or self.facet, title=title, last_k=last_k)

    def with_cli(self, formats: list[str] | None = None, y_range: list[str] | None = None,
                 size: list[str] | None = None) -> FigureOptions:
        """These options with the command line's (which win over the style file's)."""
        out = self
        if formats:
            out = replace(out, formats=parse_formats(formats, "--plot-format"))
        if y_range:
            out = replace(out, y_range=parse_y_range(y_range[0] if y_range == ["full"] else y_range, "--y-range"))
        if size:
            out = replace(out, size=parse_size(size, "--figure-size"))
        return out


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    return number


def parse_pair(value: Any, where: str, positive: bool = False) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{where} must be two numbers, e.g. [7, 4], got {value!r}")
    lo, hi = (_number(v, where) for v in value)
    if positive and (lo <= 0 or hi <= 0):
        raise ConfigError(f"{where} must be two positive numbers (inches), got {value!r}")
    return lo, hi


def parse_size(value: Any, where: str) -> tuple[float, float]:
    """A figure's width and height in inches, each within :data:`cfl.drawable.SIZE_INCHES`."""
    width, height = parse_pair(value, where, positive=True)
    check_size(width, height, where)
    return width, height


def parse_y_range(value: Any, where: str) -> tuple[float, float]:
    if value == "full":
        return FULL_RANGE
    lo, hi = parse_pair(value, where)
    if lo >= hi:
        raise ConfigError(f"{where} must be [low, high] with low < high, got {value!r} (or 'full' for 0-100)")
    return lo, hi


def parse_formats(value: Any, where: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    names = [str(v).lower() for item in items for v in str(item).split(",") if v]
    bad = [n for n in names if n not in (*FORMATS, "png")]
    if bad:
        raise ConfigError(f"{where}: unknown figure format(s) {bad}; choose from {', '.join(FORMATS)} "
                          "(PNG is always written)")
    return tuple(dict.fromkeys(n for n in names if n != "png"))


def parse_group(entry: Any, where: str) -> GroupStyle:
    from matplotlib.colors import is_color_like

    if not isinstance(entry, dict) or not isinstance(entry.get("group"), str):
        raise ConfigError(f"{where}: each entry must be a mapping with a 'group' (as the report's table names it), "
                          f"got {entry!r}")
    unknown = sorted(set(entry) - set(GROUP_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for group '{entry['group']}'; allowed: "
                          f"{', '.join(GROUP_KEYS)}")
    label, color = entry.get("label"), entry.get("color")
    if label is not None and not isinstance(label, str):
        raise ConfigError(f"{where}: the label of group '{entry['group']}' must be text, got {label!r}")
    if label is not None:
        check_label(label, f"{where}: the label of group '{entry['group']}'")
    if color is not None and not is_color_like(color):
        raise ConfigError(f"{where}: '{color}' (group '{entry['group']}') is not a colour matplotlib knows; use a "
                          "name ('tab:blue') or '#rrggbb' (quoted in YAML)")
    return GroupStyle(entry["group"], label, color)


def read_style(path: str | Path) -> FigureOptions:
    """The options of a style file (module docstring), refused with a ConfigError when anything is off."""
    from cfl.config.yaml_files import read_yaml

    where = f"--plot-style {path}"
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no such file")
    spec = read_yaml(Path(path))
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be a mapping with some of {', '.join(STYLE_KEYS)}")
    unknown = sorted(set(spec) - set(STYLE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(STYLE_KEYS)}")
    groups = None
    if "groups" in spec:
        if not isinstance(spec["groups"], list) or not spec["groups"]:
            raise ConfigError(f"{where}: 'groups' must be a non-empty list of {{group: ..., label: ..., color: ...}}")
        groups = tuple(parse_group(g, f"{where}, groups") for g in spec["groups"])
        names = [g.group for g in groups]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"{where}: group(s) {twice} listed more than once")
    return FigureOptions(
        groups=groups,
        y_range=parse_y_range(spec["y_range"], f"{where}, y_range") if "y_range" in spec else None,
        size=parse_size(spec["size"], f"{where}, size") if "size" in spec else None,
        formats=parse_formats(spec["formats"], f"{where}, formats") if "formats" in spec else ())


def fitted_range(values: list[float], options: FigureOptions) -> tuple[float, float]:
    """The y range of an accuracy axis: the option's, else the data's with a margin of 6 % of its span (at
    least 1 point), so the lowest and highest values (100 % included) are clear of the frame."""
    if options.y_range is not None:
        return options.y_range
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return FULL_RANGE
    lo, hi = min(finite), max(finite)
    pad = max(1.0, 0.06 * (hi - lo))
    return lo - pad, hi + pad
