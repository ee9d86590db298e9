"""A table's published numbers beside its records (benchmarks/campaign_published.py): means over the seeds in, the
seed count in each row, and the ordering of the methods both ways with the flipped pairs named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_published import check_published, published_text  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402

PUBLISHED = {"caption": "a paper.", "rows": {"a": {"acc": 90.0, "fgt": 1.0}, "b": {"acc": 80.0, "fgt": 2.0},
                                            "c": {"acc": 70.0, "fgt": 3.0}}}


def _record(label: str, seed: int, acc: float, fgt: float) -> dict:
    return {"method": label, "seed": seed, "acc": acc, "fgt": fgt, "config": {"label": label}}


def test_rows_give_the_mean_over_the_seeds_in_and_say_how_many_of_the_planned() -> None:
    records = [_record("a", 0, 60.0, 4.0), _record("a", 1, 70.0, 6.0), _record("b", 0, 75.0, 1.0)]
    text = published_text(PUBLISHED, records, [0, 1, 2], ["a", "b", "c"])
    assert "| a | 2 of 3 (0, 1) | 65.00 | 90.00 | 5.00 | 1.00 |" in text
    assert "| b | 1 of 3 (0) | 75.00 | 80.00 | 1.00 | 2.00 |" in text
    assert "| c | 0 of 3 | - | 70.00 | - | 3.00 |" in text
    # b (75) above a (65) here, a above b in the paper: the one flipped pair is named
    assert "By ACC, here: b > a; in the paper: a > b (over the 2 methods with both; pairs in the other order: a/b)." \
        in text
    assert "Means over fewer seeds than planned" in text


def test_the_same_order_is_said_and_one_method_is_not_an_ordering() -> None:
    records = [_record(x, s, acc, 1.0) for x, acc in (("a", 50.0), ("b", 40.0)) for s in (0, 1, 2)]
    assert "(over the 2 methods with both; the same order)." in published_text(PUBLISHED, records, [0, 1, 2], [])
    assert "not yet (fewer than two methods" in published_text(PUBLISHED, records[:1], [0, 1, 2], [])


@pytest.mark.parametrize("bad", [{"rows": {}}, {"caption": "x", "rows": {"a": {"acc": 1}}},
                                 {"caption": "x", "rows": {"a": {"acc": "90", "fgt": 1}}}, ["a"]])
def test_a_malformed_published_block_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="published"):
        check_published("tables.yaml", "t", bad)
