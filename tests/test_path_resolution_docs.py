"""The docs say how each path is resolved: a sweep's ``base:`` against the sweep file, ``model.weights``,
``data_root`` and ``out:`` against the working directory (what cfl/sweep.py and the config do)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cfl.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_say_which_paths_resolve_against_what() -> None:
    scaling = " ".join((ROOT / "docs" / "scaling.md").read_text().split())
    assert "only `base:` is resolved against the sweep file's folder" in scaling
    assert "`model.weights`, `data_root` — and the sweep's `out:` are resolved against the working directory" in (
        scaling)
    pretrained = " ".join((ROOT / "docs" / "pretrained.md").read_text().split())
    assert "A relative `model.weights` is resolved against the working directory" in pretrained


def test_a_sweeps_base_resolves_against_the_sweep_file_and_out_against_the_working_directory(tmp_path,
                                                                                           monkeypatch) -> None:
    folder = tmp_path / "sweeps"
    folder.mkdir()
    (folder / "base.yaml").write_text((ROOT / "configs" / "quickstart.yaml").read_text())
    (folder / "s.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "out": "here", "grid": {"seed": [0]}}))
    monkeypatch.chdir(tmp_path)
    runs = load_sweep(folder / "s.yaml")
    assert [Path(r.out).parent for r in runs] == [Path("here")]
