"""``cfl report --format latex``: a table a paper can ``\\input`` (needs ``\\usepackage{booktabs}``; ``--width``
also ``graphicx``).

Rules from booktabs (``\\toprule``, ``\\midrule``, ``\\bottomrule``); numbers right-aligned, text left-aligned;
each metric's title carries its direction ($\\uparrow$ higher is better, $\\downarrow$ lower is better). In each
result column (ACC, FGT, BWT, AIA, FWT; never a cost: upload, wall time, rounds to a target) the best mean is bold
within each stream and partition (the rows that compare), all of them when several tie at the printed precision; a
cell over only some of its group's runs (``(2 of 3 runs)``) is no candidate, and a block with a single candidate,
or whose candidates all tie, has no bold. Methods are named by their display label (``FedProx mu=1``, as the
figures' legends), wrapped onto lines of at most :data:`WRAP` characters (``\\shortstack``).

Layouts (``--layout``): ``rows``, one row per group with the columns asked for; ``methods-x-settings``, one row
per method and, for each setting (stream and partition) a ``\\multicolumn`` group of the result and cost columns,
the usual form of a paper's table. ``--width W`` scales the tabular to ``W`` (``\\resizebox{W}{!}{...}``, e.g.
``\\linewidth``). Cells that differ from the reference row (:mod:`cfl.report.significance`) carry a
``$^\\dagger$``, explained in a note under the tabular. With a caption or a label the tabular sits in a ``table``
float (``\\centering``, the caption above it); caption and label are LaTeX, written as given.
"""

from __future__ import annotations

import textwrap

from cfl.config.keys import ConfigError
from cfl.report.cells import Cell, Column, Stat
from cfl.report.groups import Group
from cfl.report.labels import row_label, short_keys
from cfl.report.significance import ALPHA, TESTS, Significance

LAYOUTS = ("rows", "methods-x-settings")
#: a method label longer than this is wrapped onto lines of at most this many characters
WRAP = 28
DAGGER_TEX = r"$^\dagger$"

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
ARROW = {"higher": r" $\uparrow$", "lower": r" $\downarrow$", None: ""}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def best_rows(col: Column, groups: list[Group], cells: list[Cell]) -> set[int]:
    """Indices of the rows whose cell is the column's best within its stream and partition."""
    if col.better is None or col.value is None:  # costs and counts: no best
        return set()
    best: set[int] = set()
    for block in {(g.stream, g.partition) for g in groups}:
        candidates = {i: c.shown_mean for i, (g, c) in enumerate(zip(groups, cells, strict=True))
                      if (g.stream, g.partition) == block and isinstance(c, Stat) and c.n == c.of}
        if len(set(candidates.values())) > 1:  # one candidate, or all tied: no best
            top = (max if col.better == "higher" else min)(candidates.values())
            best |= {i for i, v in candidates.items() if v == top}
    return best


def display_labels(groups: list[Group]) -> list[str]:
    """Each group's method as a paper names it: display name and short keys, wrapped when long (LaTeX)."""
    short = short_keys(sorted({k for g in groups for k in g.differs}))
    return [row_label(g.method, g.differs, g.name, display=True, shortened=short) for g in groups]


def label_tex(label: str) -> str:
    lines = textwrap.wrap(label, WRAP, break_on_hyphens=False) or [""]
    if len(lines) == 1:
        return latex_escape(label)
    return r"\shortstack[l]{" + r"\\".join(map(latex_escape, lines)) + "}"


def cell_text(cell: Cell, bold: bool, marked: bool = False) -> str:
    if cell is None:
        return "--"
    text = latex_escape(cell) if isinstance(cell, str) else cell.text(r" $\pm$ ")
    return (rf"\textbf{{{text}}}" if bold else text) + DAGGER_TEX * marked


def note_tex(sig: Significance | None) -> list[str]:
    """The dagger's note under the tabular (when a row was tested)."""
    if sig is None or not sig.ran:
        return []
    return [rf"\par\smallskip{{\footnotesize {DAGGER_TEX} differs from the {latex_escape(sig.reference)} row "
            rf"of its stream and partition at $p < {ALPHA:g}$: two-sided {latex_escape(TESTS[sig.test])}, "
            rf"paired by seed{latex_escape(sig.few_pairs_note())}.\par}}"]


def rows_layout(cols: list[Column], groups: list[Group], sig: Significance | None) -> list[str]:
    labels = display_labels(groups)
    cells = [[labels[i] if c.title == "method" else c.cell(g) for i, g in enumerate(groups)] for c in cols]
    bold = [best_rows(c, groups, column) for c, column in zip(cols, cells, strict=True)]
    align = "".join("r" if c.numeric else "l" for c in cols)

    def text(k: int, i: int) -> str:
        cell = cells[k][i]
        if cols[k].title == "method" and isinstance(cell, str):
            return label_tex(cell)
        return cell_text(cell, i in bold[k], sig is not None and sig.marked(i, k))
    body = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
            " & ".join(latex_escape(c.title) + ARROW[c.better] for c in cols) + r" \\", r"\midrule"]
    body += [" & ".join(text(k, i) for k in range(len(cols))) + r" \\" for i in range(len(groups))]
    return [*body, r"\bottomrule", r"\end{tabular}"]


def settings_layout(cols: list[Column], groups: list[Group], sig: Significance | None) -> list[str]:
    """One row per method (display label), a ``\\multicolumn`` group of the numeric columns per setting."""
    misplaced = [c.title for c in cols if not c.numeric and c.title not in ("method", "stream", "partition")]
    if misplaced:
        raise ConfigError(f"--layout methods-x-settings has one cell per method and setting: {', '.join(misplaced)} "
                          "has no place in it; leave it out of --columns (or use --layout rows)")
    metrics = [k for k, c in enumerate(cols) if c.numeric]
    if not metrics:
        raise ConfigError("--layout methods-x-settings needs a result column (acc, fgt, ...) in --columns")
    labels = display_labels(groups)
    settings = list(dict.fromkeys((g.stream, g.partition) for g in groups))
    varies = [len({s[j] for s in settings}) > 1 for j in (0, 1)]
    methods = list(dict.fromkeys(labels))
    where: dict[tuple[str, tuple[str, str]], int] = {}
    for i, (label, g) in enumerate(zip(labels, groups, strict=True)):
        if (label, (g.stream, g.partition)) in where:
            other = groups[where[(label, (g.stream, g.partition))]]
            raise ConfigError(f"--layout methods-x-settings: two rows of {g.stream} {g.partition} are both called "
                              f"{label!r} ({other.label}; {g.label}); use --layout rows")
        where[(label, (g.stream, g.partition))] = i
    cells = [[c.cell(g) for g in groups] for c in cols]
    bold = {k: best_rows(cols[k], groups, cells[k]) for k in metrics}
    width = len(metrics)
    align = "l" + "".join("r" * width for _ in settings)
    titles = [" ".join(part for part, shown in zip(s, varies, strict=True) if shown) or f"{s[0]}, {s[1]}"
              for s in settings]
    body = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
            " & ".join(["method", *(rf"\multicolumn{{{width}}}{{c}}{{{latex_escape(t)}}}" for t in titles)]) + r" \\",
            " ".join(rf"\cmidrule(lr){{{2 + n * width}-{1 + (n + 1) * width}}}" for n in range(len(settings))),
            " & ".join(["", *(latex_escape(cols[k].title) + ARROW[cols[k].better] for _ in settings for k in metrics)])
            + r" \\", r"\midrule"]
    for label in methods:
        line = [label_tex(label)]
        for s in settings:
            i = where.get((label, s))
            line += ["--" if i is None else cell_text(cells[k][i], i in bold[k], sig is not None and sig.marked(i, k))
                     for k in metrics]
        body.append(" & ".join(line) + r" \\")
    return [*body, r"\bottomrule", r"\end{tabular}"]


def latex(cols: list[Column], groups: list[Group], caption: str | None = None, label: str | None = None,
          sig: Significance | None = None, layout: str = "rows", width: str | None = None) -> str:
    """The tabular (in a ``table`` float when ``caption`` or ``label`` is given)."""
    body = (settings_layout if layout == "methods-x-settings" else rows_layout)(cols, groups, sig)
    if width is not None:
        body = [rf"\resizebox{{{width}}}{{!}}{{%", *body, "}"]
    body += note_tex(sig)
    if caption is None and label is None:
        return "\n".join(body)
    head = [r"\begin{table}[t]", r"\centering"]
    head += [rf"\caption{{{caption}}}"] * (caption is not None) + [rf"\label{{{label}}}"] * (label is not None)
    return "\n".join([*head, *body, r"\end{table}"])
