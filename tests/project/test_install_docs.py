"""The README's install route without make installs the same extras as the Makefile, and the demo runs
every method it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extras(text: str) -> list[set[str]]:
    """The extras of every ``pip install ... -e ".[a,b]"`` in ``text``."""
    return [set(found.split(",")) for found in re.findall(r"pip install[^\n]*?-e \"\.\[([\w,]+)\]\"", text)]


def test_readme_and_makefile_install_the_same_extras() -> None:
    make, text = extras((ROOT / "Makefile").read_text()), (ROOT / "README.md").read_text()
    routes = extras("\n".join(line for line in text.splitlines() if "-m venv" in line))
    assert make == [{"dev", "ray", "pretrained"}]
    assert routes and all(found == make[0] for found in routes)
    assert all(found <= make[0] for found in extras(text))  # an extra added on its own is one make installs


def test_demo_methods_are_registered() -> None:
    from cfl.methods import METHODS

    line = re.search(r"^DEMO_METHODS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert line and set(line.group(1).split()) <= set(METHODS)


def test_the_demo_figures_name_their_machine_and_say_float32_differs_across_cpus() -> None:
    readme = (ROOT / "README.md").read_text()
    demo = readme[readme.index("`make demo` prints"):readme.index("Pick methods and parameters")]
    assert re.search(r"measured \d{4}-\d\d-\d\d on a [\w-]+ (Intel|AMD) [\w ]+", demo), "the machine of the figures"
    assert "torch 2." in demo and "last digits" in demo and "Float32" in demo
    timing = re.search(r"took (\d+) s \(FedAvg\) to\s+(\d+) min", demo)
    assert timing, "the seconds per method, measured"
    config = (ROOT / "configs" / "quickstart.yaml").read_text()
    assert f"{timing.group(1)} s to {timing.group(2)} min per method" in config
