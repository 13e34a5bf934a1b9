"""units.py: the one formatter of durations, sizes, percentages and a finding's cost."""

from __future__ import annotations

import pytest

from traceanalyzer.units import (
    MISSING,
    fmt_bytes,
    fmt_bytes_short,
    fmt_cell,
    fmt_cost,
    fmt_ns,
    fmt_ns_short,
    fmt_offset,
    fmt_param,
    fmt_pct,
)


def test_fmt_cost_forms_of_each_output() -> None:
    # report.html and the default: ms/step, thousands grouped, share of the median step
    assert fmt_cost(1234.5, 12.34) == "1,234.50 ms/step (12.3 % of median step)"
    # report.md: the column header already says "per step"
    assert fmt_cost(0.611, 4.0, unit="ms") == "0.61 ms (4.0 % of median step)"
    # terminal: ungrouped, no share
    assert fmt_cost(1234.5, None, None, grouped=False) == "1234.50 ms/step"
    # a memory cost when there is no time cost; the time cost wins when both exist
    assert fmt_cost(None, None, 3 << 30) == "3.00 GiB"
    assert fmt_cost(2.0, None, 3 << 30) == "2.00 ms/step"
    assert fmt_cost(None) == MISSING
    assert fmt_cost(None, missing="") == ""


def test_durations_sizes_percentages() -> None:
    assert fmt_ns(999) == "999 ns"
    assert fmt_ns(12_345) == "12.3 µs"
    assert fmt_ns(1_234_567_890) == "1.235 s"
    assert fmt_ns(None) == MISSING
    assert fmt_ns_short(456_000) == "456 µs"
    assert fmt_ns_short(1_234_000) == "1.23 ms"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(1 << 30) == "1.00 GiB"
    assert fmt_bytes_short(None) == "0 B"
    assert fmt_bytes_short(3 * (1 << 29)) == "1.5 GiB"
    assert fmt_pct(12.345) == "12.3 %"
    assert fmt_pct(-2.0, signed=True) == "-2.0 %"
    assert fmt_pct(None) == MISSING


def test_cells_by_column_unit_and_offsets() -> None:
    t0 = 1_000_000_000
    assert fmt_cell("dur_ns", 2_500_000) == "2.500 ms"
    assert fmt_cell("peak_bytes", 2048) == "2.00 KiB"
    assert fmt_cell("busy_pct", 97.25) == "97.2 %"
    assert fmt_cell("start_ns", t0 + 1_500_000, t0) == "+1.500 ms"
    assert fmt_cell("count", 12345) == "12,345"
    assert fmt_cell("ratio", float("nan")) == MISSING
    assert fmt_offset(t0 - 2_000_000, t0) == "−2.000 ms"


def test_param_values_as_rules_show_them() -> None:
    assert fmt_param(5.0) == "5"
    assert fmt_param(0.25) == "0.25"
    assert fmt_param(16 << 20) == "16777216 (16 MiB)"
    assert fmt_param(1000) == "1000"


@pytest.mark.parametrize(("index", "kind", "name"), [
    (2, None, "GPU 2"), (0, "nvidia", "GPU 0"), (0, "amd", "GPU 0"), ("hip:0", None, "GPU 0"),
    ("cuda:1", None, "GPU 1"), (17, "mtia", "MTIA 17"), (3, "xpu", "XPU 3"), ("cpu", None, "CPU"),
    (None, None, "GPU ?"), ("type7:0", None, "TYPE7 0"),
])
def test_device_name_one_name_per_device(index: int | str | None, kind: str | None, name: str) -> None:
    from traceanalyzer.units import device_name

    assert device_name(index, kind) == name
