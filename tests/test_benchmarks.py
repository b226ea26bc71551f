"""The benchmark runner runs (tiny iteration counts). No timing is asserted here."""

from __future__ import annotations

import math

from benchmarks.report import format_table
from benchmarks.run import run


def test_runner_produces_a_row_per_case_with_numbers_or_a_reason() -> None:
    result = run(quick=True)
    rows = result["rows"]
    cases = {r["case"] for r in rows}
    assert {"fork_rng(devices=[])", "import devrng after import torch"} <= cases
    for r in rows:
        if r["ratio"] is None:
            assert r.get("ms") is not None or r["note"].startswith("skipped: ")
        else:
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0
            assert math.isclose(r["ratio"], r["devrng_us"] / r["peer_us"])
    table = format_table(rows)
    for r in rows:
        if r["ratio"] is not None or r.get("ms") is not None:
            assert f"| {r['case']}" in table  # every case that ran is a row
        else:
            assert r["case"] in table.split("Not run in this environment:")[1]  # named once
    compile_rows = [r for r in rows if r.get("compiles") is not None and r["target"] is not None]
    for r in compile_rows:
        assert f"{r['case']}: compilations for 50 distinct seeds | {r['compiles']}" in table
    noted = [r for r in rows if r["ratio"] is not None and r.get("note")]
    assert table.count("[^") == 2 * len(noted)  # each note is a footnote, referenced once
