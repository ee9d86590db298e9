"""What matplotlib can draw, checked before any work, and a figure that fails anyway kept from costing the rest.

- :func:`check_label`: a label (a config's ``label``, a style file's legend text) is one line, and its mathtext
  (``$...$``, drawn by matplotlib's parser wherever a label has an even number of unescaped ``$``) parses;
  refused otherwise (exit code 2), naming the key. matplotlib is imported only for a label holding ``$``.
- :func:`check_size`: a figure size matplotlib can draw at the PNG resolution (:data:`PNG_DPI`).
- :func:`drawn`: draws one figure; a failure (a matplotlib error on data or labels no check foresaw, e.g. a
  ``results.json`` written by an older cfl) is printed naming the figure and why, and the caller goes on with
  the others: a run keeps its ``results.json`` and every other output (docs/reliability.md, "Figures").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from cfl.config.schema import ConfigError

#: the resolution every PNG is written at (``savefig(dpi=...)``)
PNG_DPI = 120
#: inches a figure's side may have: at least one (axes, ticks and a title need room; matplotlib cannot write an
#: image under a pixel), at most 100 (12,000 pixels at PNG_DPI; a 100 x 100 inch PNG is 576 MB of RGBA while
#: drawn, where 100,000 inches fail in matplotlib after the other outputs are written)
SIZE_INCHES = (1.0, 100.0)


def check_label(text: str, where: str) -> None:
    """Refuse a label that is not one line or whose mathtext matplotlib cannot parse (``$\\sqrt{2$``)."""
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{where} holds a line break ({text!r}); a label is one line: a table row, a legend entry "
                          "and a LaTeX cell. Remove the line break")
    dollars = text.count("$") - text.count(r"\$")
    if dollars < 2 or dollars % 2:  # matplotlib draws it as plain text (cbook.is_math_text)
        return
    from matplotlib.mathtext import MathTextParser

    try:
        MathTextParser("path").parse(text)
    except ValueError as err:
        problem = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise ConfigError(f"{where} {text!r} is mathtext (text between $ signs) that matplotlib cannot draw: "
                          f"{problem}. Fix the formula, or write \\$ for a dollar sign") from None


def check_size(width: float, height: float, where: str) -> None:
    """Refuse a figure size (inches) outside :data:`SIZE_INCHES`."""
    low, high = SIZE_INCHES
    if not (low <= width <= high and low <= height <= high):
        raise ConfigError(f"{where} is {width:g} x {height:g} inches; each side must be {low:g} to {high:g} inches "
                          f"(at {PNG_DPI} dpi, {int(high * PNG_DPI)} pixels at most), e.g. 7 4")


def drawn(name: str, draw: Callable[[], Path], failed: list[str] | None = None) -> Path | None:
    """``draw()``'s file, or None with ``cfl: warning: figure NAME not written: ...`` on stderr when it raised
    (``failed`` collects the names); the half-drawn figure is closed."""
    try:
        return draw()
    except Exception as err:  # noqa: BLE001 -- any drawing error: named, and the other outputs are kept
        import matplotlib.pyplot as plt

        plt.close("all")
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"cfl: warning: figure {name} not written: {type(err).__name__}: {first}", file=sys.stderr, flush=True)
        if failed is not None:
            failed.append(name)
        return None
