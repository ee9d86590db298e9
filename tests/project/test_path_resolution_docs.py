"""The docs say how each path is resolved: a sweep's ``base:`` against the sweep file, ``model.weights``,
``data_root`` and ``out:`` against the working directory (what cfl/app/sweep.py and the config do)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cfl.app.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_missing_relative_weights_file_is_said_to_resolve_against_the_working_directory(tmp_path, monkeypatch):
    import pytest

    from cfl.config.schema import ConfigError
    from cfl.pretrained.weights import weights_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        weights_path("weights/vit.safetensors")
    message = str(err.value)
    assert f"resolved against the working directory, {tmp_path}, not against the config or sweep file" in message
    assert "only a sweep's base: is resolved against the sweep file" in message and "does not exist" in message
    with pytest.raises(ConfigError) as err:  # an absolute path: nothing to resolve, nothing said about it
        weights_path(str(tmp_path / "none.safetensors"))
    assert "working directory" not in str(err.value)


def test_a_missing_sweep_base_names_both_places_it_was_looked_for(tmp_path, monkeypatch):
    import pytest

    from cfl.config.schema import ConfigError

    folder = tmp_path / "sweeps"
    folder.mkdir()
    (folder / "s.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"seed": [0]}}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_sweep(folder / "s.yaml")
    message = str(err.value)
    assert f"'{folder / 'base.yaml'}': a relative base: is resolved against it first" in message
    assert f"working directory ('{tmp_path / 'base.yaml'}')" in message
    assert "(model.weights, data_root) and out: are resolved against the working directory" in message
