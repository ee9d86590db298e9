"""``cfl report --format latex``: a table a paper can ``\\input`` (needs ``\\usepackage{booktabs}``).

Rules from booktabs (``\\toprule``, ``\\midrule``, ``\\bottomrule``); numbers right-aligned, text left-aligned;
each metric's title carries its direction ($\\uparrow$ higher is better, $\\downarrow$ lower is better). In each
column with a direction the best mean is bold within each stream and partition (the rows that compare), all
of them when several tie at the printed precision; a cell over only some of its group's runs (``(2 of 3 runs)``)
is no candidate, and a block with a single candidate, or whose candidates all tie, has no bold. With a caption
or a label the tabular sits in a ``table`` float (``\\centering``, the caption above it); caption and label are
LaTeX, written as given.
"""

from __future__ import annotations

from cfl.report.cells import Cell, Column, Stat
from cfl.report.groups import Group

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
ARROW = {"higher": r" $\uparrow$", "lower": r" $\downarrow$", None: ""}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def best_rows(col: Column, groups: list[Group], cells: list[Cell]) -> set[int]:
    """Indices of the rows whose cell is the column's best within its stream and partition."""
    if col.better is None:
        return set()
    best: set[int] = set()
    for block in {(g.stream, g.partition) for g in groups}:
        candidates = {i: c.shown_mean for i, (g, c) in enumerate(zip(groups, cells, strict=True))
                      if (g.stream, g.partition) == block and isinstance(c, Stat) and c.n == c.of}
        if len(set(candidates.values())) > 1:  # one candidate, or all tied: no best
            top = (max if col.better == "higher" else min)(candidates.values())
            best |= {i for i, v in candidates.items() if v == top}
    return best


def cell_text(cell: Cell, bold: bool) -> str:
    if cell is None:
        return "--"
    text = latex_escape(cell) if isinstance(cell, str) else cell.text(r" $\pm$ ")
    return rf"\textbf{{{text}}}" if bold else text


def latex(cols: list[Column], groups: list[Group], caption: str | None = None, label: str | None = None) -> str:
    """The tabular (in a ``table`` float when ``caption`` or ``label`` is given)."""
    cells = [[c.cell(g) for g in groups] for c in cols]  # by column
    bold = [best_rows(c, groups, column) for c, column in zip(cols, cells, strict=True)]
    align = "".join("r" if c.numeric else "l" for c in cols)
    body = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
            " & ".join(latex_escape(c.title) + ARROW[c.better] for c in cols) + r" \\", r"\midrule"]
    body += [" & ".join(cell_text(cells[k][i], i in bold[k]) for k in range(len(cols))) + r" \\"
             for i in range(len(groups))]
    body += [r"\bottomrule", r"\end{tabular}"]
    if caption is None and label is None:
        return "\n".join(body)
    head = [r"\begin{table}[t]", r"\centering"]
    head += [rf"\caption{{{caption}}}"] * (caption is not None) + [rf"\label{{{label}}}"] * (label is not None)
    return "\n".join([*head, *body, r"\end{table}"])
