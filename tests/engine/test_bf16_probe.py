"""bf16-mixed's speed check from measured product rates (cfl/engine/local/bf16_probe.py, cfl/engine/local/precision.py):
the decision on hand-set rates, the per-machine cache (write, read, damaged file) and the warning's figures."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from cfl.engine.local import bf16_probe, precision
from cfl.engine.local.bf16_probe import ProbeResult, ProductRates, bf16_slower, probed_rates, read_cache
from cfl.engine.local.cpuinfo import cpu_model

#: the issue's Xeon (avx512_bf16, no AMX): 2048^2 products at 176 GFLOP/s in bfloat16, 347 in float32
XEON = ProductRates(176.0, 347.0)


@pytest.mark.parametrize(("rates", "slower"), [(XEON, True), (ProductRates(347.0, 176.0), False),
                                                (ProductRates(100.0, 100.0), True),
                                                (ProductRates(101.0, 100.0), False)])
def test_bf16_mixed_is_slower_when_its_products_are_no_faster(rates, slower):
    assert bf16_slower(rates) is slower


def test_ratio_is_bf16_over_fp32():
    assert XEON.ratio == pytest.approx(176 / 347)


class Measure:
    """A stand-in for the probe that counts its calls."""

    def __init__(self, rates: ProductRates = XEON) -> None:
        self.rates, self.calls = rates, 0

    def __call__(self) -> ProductRates:
        self.calls += 1
        return self.rates


def test_rates_are_measured_once_then_read_from_the_cache(tmp_path):
    path, measure = tmp_path / "cache" / "bf16_probe.json", Measure()
    first = probed_rates(path, measure)
    assert measure.calls == 1 and first.rates == XEON and "measured now" in first.source
    assert json.loads(path.read_text())[first.key] == {"bf16_gflops": 176.0, "fp32_gflops": 347.0}
    second = probed_rates(path, measure)
    assert measure.calls == 1 and second.rates == XEON and "cached in" in second.source
    assert [p.name for p in path.parent.iterdir()] == ["bf16_probe.json"]  # no temporary file left


def test_the_key_names_cpu_model_torch_version_and_threads():
    key = bf16_probe.machine_key()
    assert cpu_model() in key and torch.__version__ in key and f"{torch.get_num_threads()} threads" in key


def test_another_machines_entry_is_kept(tmp_path):
    path = tmp_path / "bf16_probe.json"
    path.write_text(json.dumps({"other CPU | torch 0 | 7 threads": {"bf16_gflops": 1.0, "fp32_gflops": 2.0}}))
    measure = Measure()
    probed_rates(path, measure)
    assert measure.calls == 1
    assert set(read_cache(path)) == {"other CPU | torch 0 | 7 threads", bf16_probe.machine_key()}


@pytest.mark.parametrize("damaged", ["{not json", "[]", '{"k": {"bf16_gflops": "x", "fp32_gflops": 1}}',
                                     '{"k": {"bf16_gflops": 1}}', '{"k": {"bf16_gflops": NaN, "fp32_gflops": 1}}',
                                     '{"k": {"bf16_gflops": -1, "fp32_gflops": 1}}', '{"k": 3}', "\udcff"])
def test_a_damaged_cache_is_measured_again_and_rewritten(tmp_path, damaged):
    path = tmp_path / "bf16_probe.json"
    path.write_bytes(damaged.encode("utf-8", "surrogateescape"))
    measure = Measure()
    result = probed_rates(path, measure)
    assert measure.calls == 1 and result.rates == XEON and "could not be read and was replaced" in result.source
    assert read_cache(path) == {result.key: XEON}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "bf16_probe.json"
    bf16_probe.write_cache(path, {"old": XEON})
    before = path.read_bytes()

    def fail(_self, _target):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", fail)
    result = probed_rates(path, Measure())
    assert result.rates == XEON and "could not cache them" in result.source and "disk full" in result.source
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["bf16_probe.json"]


def test_the_cache_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CFL_PROBE_CACHE", str(tmp_path / "mine.json"))
    assert bf16_probe.cache_path() == tmp_path / "mine.json"
    monkeypatch.delenv("CFL_PROBE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bf16_probe.cache_path() == tmp_path / "cfl" / "bf16_probe.json"


def test_the_probe_measures_positive_rates_quickly():
    rates = bf16_probe.ProductRates(bf16_probe.product_rate(torch.bfloat16, ((1, 8, 8, 8),), 1),
                                    bf16_probe.product_rate(torch.float32, ((1, 8, 8, 8),), 1))
    assert rates.bf16_gflops > 0 and rates.fp32_gflops > 0


def probe_says(monkeypatch, rates: ProductRates) -> list[str]:
    """The RuntimeWarnings of bf16-mixed's first training on CPU when the probe measures ``rates``."""
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setattr(bf16_probe, "probed_rates", lambda: ProbeResult(rates, "a CPU | torch x | 2 threads",
                                                                         "measured now, cached in /c.json"))
    cpu = torch.device("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision.warn_if_slow(32, cpu)
        precision.warn_if_slow("bf16-mixed", cpu)
        precision.warn_if_slow("bf16-mixed", cpu)
    return [str(w.message) for w in caught if w.category is RuntimeWarning]


def test_a_cpu_with_slower_bfloat16_products_is_warned_once_with_the_figures(monkeypatch):
    """The issue's Xeon lists avx512_bf16, so the flags-only check of old said nothing."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16", "avx512f"})
    [message] = probe_says(monkeypatch, XEON)
    for part in ("SLOWER than precision: 32", "176.0 GFLOP/s", "347.0 GFLOP/s in float32", "(0.51x",
                 "a CPU | torch x | 2 threads", "flags: avx512_bf16", "cached in /c.json", "set precision: 32"):
        assert part in message, part


def test_a_cpu_with_faster_bfloat16_products_is_not_warned(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())  # flags listing none: the rates decide, not them
    assert probe_says(monkeypatch, ProductRates(347.0, 176.0)) == []
