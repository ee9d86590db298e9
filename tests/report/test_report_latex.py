"""`cfl report --format latex`: booktabs, caption and label, the best per column in bold by each
metric's direction, chosen columns, the row order given; a structural check always, pdflatex when installed."""

import re
import shutil
import subprocess

import pytest

from cfl.app.cli import main
from cfl.report.table import TableOptions, report
from tests.report.test_report import rows, write_results

ENVIRONMENT = re.compile(r"\\(begin|end)\{(\w+)\}")


def split_cells(line: str) -> list[str]:
    """A tabular row's cells (``&`` not escaped), less the closing ``\\\\``."""
    assert line.endswith(r" \\"), line
    return [c.strip() for c in re.split(r"(?<!\\)&", line[: -len(r" \\")])]


def assert_latex_structure(text: str, columns: int, rows: int) -> tuple[list[str], list[list[str]]]:
    """Check what LaTeX would: environments nest and close, braces and ``$`` balance, booktabs rules in order
    around the header and ``rows`` body rows of ``columns`` cells; returns the header and body cells."""
    stack: list[str] = []
    for kind, name in ENVIRONMENT.findall(text):
        if kind == "begin":
            stack.append(name)
        else:
            assert stack and stack.pop() == name, f"\\end{{{name}}} closes nothing open:\n{text}"
    assert not stack, f"not closed: {stack}"
    depth = 0
    for ch in re.sub(r"\\[{}$]", "", text):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0, text
    assert depth == 0 and re.sub(r"\\\$", "", text).count("$") % 2 == 0, text
    assert r"\hline" not in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(r"\begin{tabular}"))
    spec = re.fullmatch(r"\\begin\{tabular\}\{([lrc]+)\}", lines[start])
    assert spec and len(spec.group(1)) == columns, lines[start]
    table = lines[start + 1 : lines.index(r"\end{tabular}")]
    assert [table[0], table[2], table[-1]] == [r"\toprule", r"\midrule", r"\bottomrule"], table
    body = table[3:-1]
    assert len(body) == rows and all(len(split_cells(line)) == columns for line in [table[1], *body]), table
    return split_cells(table[1]), [split_cells(line) for line in body]


def test_latex_is_a_well_formed_tabular_with_special_characters_escaped(tmp_path):
    write_results(tmp_path / "a", 0, 70.0, 1.0, method="my_method", partition="dirichlet", bwt=-1.0,
                  config={"method": {"name": "my_method", "note": "50% & #1"}})
    write_results(tmp_path / "b", 0, 70.0, 1.0, method="my_method", partition="dirichlet", bwt=-1.0,
                  config={"method": {"name": "my_method", "note": "x_{1}^2 ~ $y$"}})
    text = report([tmp_path], "latex")
    # the paper's default columns: method (display label), ACC, FGT, upload; no stream, partition (the same in
    # all rows), runs, seeds or wall
    header, _ = assert_latex_structure(text, columns=4, rows=2)
    assert header == ["method", r"ACC (\%) $\uparrow$", r"FGT (\%) $\downarrow$", r"upload (GiB) $\downarrow$"]
    body = [line for line in text.splitlines() if line.endswith(r"\\")]  # one run each, all tied: no bold
    assert r"my\_method note=50\% \& \#1 & " in body[1] and " & 70.00 & " in body[1]  # no $\pm$
    assert r"note=x\_\{1\}\textasciicircum{}2 \textasciitilde{} \$y\$ & " in body[2]
    unescaped = re.sub(r"\\[%&#_${}]|\$\\(pm|uparrow|downarrow)\$|\\text\w+\{\}|\\\w+rule", "", text)
    assert not re.search(r"[%&#_$^~]", unescaped.replace(" & ", "")), text


def methods_table(tmp_path, **extra):
    """FedAvg 70/5, EWC 80/2 (two seeds: 80 ± 0), FedProx 80.001/3: ACC ties at 80.00, FGT best is EWC's."""
    for name, acc, fgt, seeds in (("fedprox", 80.001, 3.0, (0,)), ("ewc", 80.0, 2.0, (0, 1)),
                                  ("fedavg", 70.0, 5.0, (0,))):
        for seed in seeds:
            write_results(tmp_path / f"{name}-{seed}", seed, acc, fgt, method=name, config={"method": {"name": name}},
                          **extra)


def test_booktabs_table_with_caption_label_and_the_best_in_bold_by_direction(tmp_path):
    methods_table(tmp_path)
    options = TableOptions(columns=("method", "acc", "fgt"), caption="Split digits, one or two seeds.",
                           label="tab:digits")
    text = report([tmp_path], "latex", options)
    lines = text.splitlines()
    assert lines[:4] == [r"\begin{table}[t]", r"\centering", r"\caption{Split digits, one or two seeds.}",
                         r"\label{tab:digits}"] and lines[-1] == r"\end{table}"
    header, body = assert_latex_structure(text, columns=3, rows=3)
    assert header == ["method", r"ACC (\%) $\uparrow$", r"FGT (\%) $\downarrow$"]
    assert body == [["FedAvg", "70.00", "5.00"],  # FedAvg first by default; display labels
                    ["EWC+FL", r"\textbf{80.00 $\pm$ 0.00}", r"\textbf{2.00 $\pm$ 0.00}"],  # ACC: a tie at 80.00
                    ["FedProx", r"\textbf{80.00}", "3.00"]]


def test_a_bare_tabular_without_caption_or_label_and_the_order_given(tmp_path):
    methods_table(tmp_path)
    text = report([tmp_path], "latex", TableOptions(columns=("method", "fgt"), order=("fedprox", "ewc")))
    assert text.splitlines()[0] == r"\begin{tabular}{lr}" and r"\begin{table}" not in text
    _, body = assert_latex_structure(text, columns=2, rows=3)
    assert [r[0] for r in body] == ["FedProx", "EWC+FL", "FedAvg"]
    assert [r["method"] for r in rows(report([tmp_path], options=TableOptions(order=("ewc",))))] == [
        "ewc", "fedavg", "fedprox"]  # the rest as sorted (FedAvg first only by default)


def test_bold_compares_rows_of_one_stream_and_partition_and_full_cells_only(tmp_path):
    # stream a: one row (no bold); stream b: rounds to 50% 3 (over all runs) against 2 (over 1 of 2 runs: no candidate)
    write_results(tmp_path / "a", 0, 99.0, 0.0, stream="a")
    write_results(tmp_path / "b1", 0, 60.0, 1.0, stream="b", config={"lr": 0.1}, rounds_to_target={"0": {"50": 3}})
    write_results(tmp_path / "b2", 0, 50.0, 2.0, stream="b", config={"lr": 0.2}, rounds_to_target={"0": {"50": 2}})
    write_results(tmp_path / "b3", 1, 50.0, 2.0, stream="b", config={"lr": 0.2}, rounds_to_target={"0": {"50": None}})
    text = report([tmp_path], "latex", TableOptions(columns=("stream", "method", "acc", "targets")))
    _, body = assert_latex_structure(text, columns=4, rows=3)
    assert body == [["a", "FedAvg", "99.00", "no target set"],
                    ["b", "FedAvg lr=0.1", r"\textbf{60.00}", "3.0"],
                    ["b", "FedAvg lr=0.2", r"50.00 $\pm$ 0.00", "2.0 (1 of 2 runs)"]]


def test_the_command_line_options_reach_the_table(tmp_path, capsys):
    methods_table(tmp_path)
    argv = ["report", str(tmp_path), "--format", "latex", "--columns", "method, acc", "--order", "ewc",
            "--caption", r"ACC over seeds ($\pm$ one std).", "--label", "tab:acc"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    _, body = assert_latex_structure(out.strip(), columns=2, rows=3)
    assert [r[0] for r in body] == ["EWC+FL", "FedAvg", "FedProx"]
    assert r"\caption{ACC over seeds ($\pm$ one std).}" in out and r"\label{tab:acc}" in out


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (Debian: apt-get install texlive-latex-base "
                           "texlive-latex-recommended); the structural tests above still run")
def test_the_latex_table_compiles_in_a_document(tmp_path):
    methods_table(tmp_path, rounds_to_target={"0": {"50": 3}}, upload_bytes=2 ** 30, wall_seconds=12.5)
    write_results(tmp_path / "odd", 0, 60.0, 1.0, method="my_method", partition="dirichlet",
                  config={"method": {"name": "my_method", "note": "50% & #1 x_{1}^2 ~ $y$ \\"}})
    every = ("stream", "partition", "method", "runs", "seeds", "acc", "fgt", "bwt", "aia", "fwt", "targets",
             "upload", "wall")
    (tmp_path / "table.tex").write_text(report([tmp_path], "latex", TableOptions(every, caption="All columns.",
                                                                                  label="tab:all")))
    (tmp_path / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                                        "\\input{table}\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "Warning" in line and "Rerun to get" not in line]
    assert (tmp_path / "paper.pdf").stat().st_size > 0 and not warnings, done.stdout[-3000:]
