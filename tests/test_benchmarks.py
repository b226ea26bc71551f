"""The benchmark runner runs (tiny iteration counts). No timing is asserted here."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from benchmarks import bench_portable, report
from benchmarks.report import format_table
from benchmarks.run import run


def test_runner_produces_a_row_per_case_with_numbers_or_a_reason() -> None:
    result = run(quick=True)
    rows = result["rows"]
    cases = {r["case"] for r in rows}
    assert {"fork_rng(devices=[])", "import devrng after import torch"} <= cases
    for r in rows:
        if r["ratio"] is None:
            assert (r.get("ms") is not None or r.get("us") is not None
                    or r["note"].startswith("skipped: "))
        else:
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0
            assert math.isclose(r["ratio"], r["devrng_us"] / r["peer_us"])
    table = format_table(rows)
    for r in rows:
        if r["ratio"] is not None or r.get("ms") is not None or r.get("us") is not None:
            assert f"| {r['case']}" in table  # every case that ran is a row
        else:
            assert r["case"] in table.split("Not run in this environment:")[1]  # named once
    compile_rows = [r for r in rows if r.get("compiles") is not None and r["target"] is not None]
    for r in compile_rows:
        assert f"{r['case']}: compilations for 50 distinct seeds | {r['compiles']}" in table
    noted = [r for r in rows if (r["ratio"] is not None or r.get("us") is not None)
             and r.get("note")]
    assert table.count("[^") == 2 * len(noted)  # each note is a footnote, referenced once


def test_portable_benchmark_times_every_op_family_with_and_without_the_kernel() -> None:
    rows = bench_portable.run(quick=True)
    cases = [r["case"] for r in rows]
    families = [name for name, _, _ in bench_portable.ops(1 << 14)]
    for family in families:
        assert f"portable {family}, eager CPU" in cases
    without = [c for c in cases if c.endswith("without the C kernel")]
    assert [c.removeprefix("portable ").split(",")[0] for c in without] == [
        f.split(",")[0] for f in families if f.startswith(bench_portable.NO_KERNEL)]
    assert len(without) == 7  # rand and randn in two dtypes, randn in bfloat16, randint, dropout
    assert sum(r.get("ms") is not None for r in rows) == 2  # the first draw, the kernel's checks
    for r in rows:
        if r.get("ms") is not None:
            assert r["ms"] > 0 and r["target_ms"] == bench_portable.FIRST_DRAW_TARGET_MS
        elif r["ratio"] is None:
            assert r["note"].startswith("skipped: ")
        else:
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0
    table_rows = format_table(rows).splitlines()
    assert sum(line.startswith("| portable") and "without the C kernel" in line
               for line in table_rows) == len(without)


def test_check_benchmark_times_a_step_with_every_op_recorded() -> None:
    from benchmarks import bench_checks

    (row,) = bench_checks.run(quick=True)
    assert row["case"].startswith("check-determinism: one CNN step with every op recorded")
    assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    assert math.isclose(row["ratio"], row["devrng_us"] / row["peer_us"])


def test_the_portable_grid_times_every_op_family_and_dtype_at_each_size_and_thread_count(
        ) -> None:
    grid = bench_portable.bench_grid((10, 12), (1, 2), rounds=1)
    cases = {(family, dtype) for family, dtype, _ in bench_portable.grid_ops()}
    assert {(r["family"], r["dtype"]) for r in grid} == cases
    assert {d for _, d in cases} == {"float16", "bfloat16", "float32", "float64", "int64"}
    assert len(grid) == len(cases) * 2 * 2  # two sizes, one and two threads
    for r in grid:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert math.isclose(r["ratio"], r["devrng_us"] / r["peer_us"])
        assert r["target"] == 4.0  # below 2**16 elements
    table = report.format_grid(grid).splitlines()
    assert table[0] == "| op | dtype | 2**10 | 2**12 |"
    assert len([line for line in table if line.startswith("| ") and "|---" not in line]) == \
        len(cases) + 1
    missed = sum(r["ratio"] > r["target"] for r in grid)
    assert sum(line.count("**") for line in table[2:-2]) == 2 * missed  # those in bold
    assert table[-1] == f"{len(grid)} cells, {missed} above their target."


def test_the_first_portable_draw_is_timed_in_fresh_processes() -> None:
    rows = bench_portable.bench_first_draw(1)
    assert [r["target_ms"] for r in rows] == [bench_portable.FIRST_DRAW_TARGET_MS] * 2
    assert all(0 < r["ms"] < 60_000 for r in rows)
    assert "torch's first `torch.rand(1)`" in rows[0]["case"]
    table = format_table(rows)
    assert table.count("≤ 50 ms") == 2


# -- the report: tables and charts from saved results -----------------------------------
SAVED = sorted(report.SAVED.glob("results-*.json"))
PORTABLE = sorted(report.SAVED.glob("portable-*.json"))


def _saved(files: list[Any] = SAVED) -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem.partition("-")[2], json.loads(p.read_text())) for p in files]


def _between(page: str, begin: str, end: str) -> str:
    return page.split(begin + "\n", 1)[1].split("\n" + end, 1)[0]


def test_the_portable_tables_and_costs_show_the_saved_results() -> None:
    """The portable tables of docs/benchmarks.md and the cost table of docs/portable.md are
    what the report renders from benchmarks/results/portable-*.json."""
    saved = _saved(PORTABLE)
    assert {env for env, _ in saved} >= {"core", "xla"}
    bench_page = (report.DOCS / "benchmarks.md").read_text()
    assert _between(bench_page, report.PORTABLE_BEGIN, report.PORTABLE_END) == \
        report.render_portable(saved)
    costs = _between((report.DOCS / "portable.md").read_text(), report.COSTS_BEGIN,
                     report.COSTS_END)
    assert costs == report.render_costs(saved)
    for family in ("torch.randn(2**20)", "torch.randint(0, 1000, (2**20,))",
                   "torch.rand(2**20, dtype=float64)", "without the C kernel"):
        assert family in costs


def test_the_page_shows_the_saved_results() -> None:
    """docs/benchmarks.md is what the report renders from benchmarks/results/ (so the
    page and its charts can be rendered again, and never drift from the data)."""
    assert {env for env, _ in _saved()} >= {"bench", "xla"}
    page = (report.DOCS / "benchmarks.md").read_text()
    shown = _between(page, report.BEGIN, report.END)
    assert shown == report.render(_saved())
    for env, _ in _saved():
        assert (report.DOCS / f"benchmarks-{env}.png").is_file()
        assert (report.DOCS / f"benchmarks-{env}-narrow.png").is_file()
        # A phone (Material's phone layout) is given the chart drawn for its column.
        assert (f'<source media="{report.NARROW}" srcset="../benchmarks-{env}-narrow.png">'
                f'<img src="../benchmarks-{env}.png"') in shown


def test_chart_labels_say_what_each_bar_compares_and_never_repeat() -> None:
    for _, result in _saved():
        labels = [label for label, _, _ in report.chart_rows(result)]
        assert labels and all("\nvs " in label for label in labels)
    twice = {"rows": [{"case": "fork", "peer": "torch", "ratio": 0.5, "target": 0.8}] * 2}
    with pytest.raises(ValueError, match="labelled alike"):
        report.chart_rows(twice)


def test_charts_are_drawn_for_the_docs_column() -> None:
    """The committed charts (drawn by the bench environment, which has matplotlib) are as
    wide as the column at 200 dpi and tall enough for two label lines per bar."""
    for env, result in _saved():
        png = (report.DOCS / f"benchmarks-{env}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
        assert width == 1500  # 7.5 in at 200 dpi
        assert height > 150 * len(report.chart_rows(result))
        # The phone's chart: 3.6 in at 200 dpi, read at about 360 px (2 device pixels each),
        # with room for wrapped labels.
        png = (report.DOCS / f"benchmarks-{env}-narrow.png").read_bytes()
        width, height = struct.unpack(">II", png[16:24])
        assert width == 720 and height > 150 * len(report.chart_rows(result))


def test_the_flight_record_bench_reports_its_own_work_the_cnn_share_and_bytes() -> None:
    """bench_flight gives, with and without a tracked DataLoader, the record's own µs per
    step against its budget with its bytes per step, the same added to the CNN's training
    step against 1.01x, and the CNN's whole step on and off."""
    from benchmarks.bench_training import FLIGHT_BUDGET_US, bench_flight

    rows = bench_flight(1, 1)
    sizes = []
    for mode in ("a tracked DataLoader", "no tracked DataLoader"):
        own = f"flight record: its own work per optimizer step, {mode}"
        (work,) = [r for r in rows if r["case"] == f"{own} (CPU)"]
        assert work["target_us"] == FLIGHT_BUDGET_US and math.isfinite(work["us"])
        assert 100 < work["bytes"] < 400  # a line a step, a few hundred bytes at most
        sizes.append(work["bytes"])
        (share,) = [r for r in rows if r["case"] == "flight record's own work + the MNIST "
                    f"tutorials' CNN's step, {mode}"]
        (cnn,) = [r for r in rows if r["case"] == "flight record: one training step of the "
                  f"MNIST tutorials' CNN (batch 64, CPU), {mode}"]
        assert share["target"] == 1.01 and share["peer_us"] == cnn["peer_us"]  # (without)
        assert math.isclose(share["devrng_us"], cnn["peer_us"] + work["us"])
    assert sizes[0] > sizes[1]  # with a loader: the batch's digest, indices and position
    table = format_table(rows)
    assert f"| ≤ {FLIGHT_BUDGET_US:g} µs: " in table


def test_table_marks_each_target_met_or_missed() -> None:
    rows = [{"case": "a", "devrng_us": 1.0, "peer": "p", "peer_us": 2.0, "ratio": 0.5,
             "target": 0.8, "note": ""},
            {"case": "b", "devrng_us": 3.0, "peer": "p", "peer_us": 2.0, "ratio": 1.5,
             "target": 1.2, "note": ""}]
    table = report.format_table(rows)
    assert "| a | 1.00 µs | p: 2.00 µs | 0.50× | ≤ 0.8×: met |" in table
    assert "| b | 3.00 µs | p: 2.00 µs | 1.50× | ≤ 1.2×: **missed** |" in table
    budget = [{"case": "c", "us": 120.0, "target_us": 130.0, "note": ""},
              {"case": "d", "us": 140.0, "target_us": 130.0, "note": "why"}]
    table = report.format_table(budget)
    assert "| c | 120.00 µs | - | - | ≤ 130 µs: met |" in table
    assert "| d[^1] | 140.00 µs | - | - | ≤ 130 µs: **missed** |" in table
