"""Docs that are generated from code must match it."""

from pathlib import Path

from cfl.cli import config_reference

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_up_to_date():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == config_reference(), "regenerate: cfl config-reference > docs/configuration.md"
