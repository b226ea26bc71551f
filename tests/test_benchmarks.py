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
    compile_rows = [r for r in rows if r.get("compiles") is not None and r["target"] is not None]
    assert table.count("\n") == len(rows) + len(compile_rows) + 1
    for r in compile_rows:
        assert f"{r['case']}: compilations for 50 distinct seeds | {r['compiles']}" in table
