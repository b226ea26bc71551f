"""Render benchmark results (JSON files from benchmarks.run) into docs/benchmarks.md and a chart.

    python -m benchmarks.report results-bench.json results-xla.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Row = dict[str, Any]
DOCS = Path(__file__).resolve().parent.parent / "docs"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def format_table(rows: list[Row]) -> str:
    lines = ["| case | devrng | peer | peer time | ratio | target | met |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("ms") is not None:
            met = "yes" if r["ms"] <= r["target_ms"] else "no"
            lines.append(f"| {r['case']} | {r['ms']:.1f} ms | - | - | - | <= 30 ms | {met} |")
            continue
        if r["ratio"] is None:
            lines.append(f"| {r['case']} | - | {r['peer']} | - | - | "
                         f"{_target(r['target'])} | {r['note']} |")
            continue
        met = "-" if r["target"] is None else ("yes" if r["ratio"] <= r["target"] else "no")
        lines.append(f"| {r['case']} | {r['devrng_us']:.2f} µs | {r['peer']} | "
                     f"{r['peer_us']:.2f} µs | {r['ratio']:.2f}x | {_target(r['target'])} | {met} |")
        if r.get("compiles") is not None and r["target"] is not None:  # seeded_jit: 50 seeds
            ok = "yes" if r["compiles"] <= r.get("target_compiles", 1) else "no"
            first = r.get("compiles_after_first_call")  # the count once the first call returned
            later = "" if first is None else f" ({r['compiles'] - first} after the first seed)"
            lines.append(f"| {r['case']}: compilations for 50 distinct seeds | "
                         f"{r['compiles']}{later} | - | - | - | {r.get('target_compiles', 1)} | {ok} |")
    return "\n".join(lines)


def _target(t: float | None) -> str:
    return "-" if t is None else f"<= {t}x"


def chart(results: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios, targets = [], [], []
    for env, result in results:
        for r in result["rows"]:
            if r["ratio"] is not None and r["target"] is not None:
                labels.append(f"{r['case']}\nvs {r['peer']} [{env}]")
                ratios.append(r["ratio"])
                targets.append(r["target"])
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(labels) + 1.2))
    y = range(len(labels))
    colors = ["tab:green" if v <= t else "tab:red" for v, t in zip(ratios, targets, strict=True)]
    ax.barh(list(y), ratios, color=colors)
    ax.scatter(targets, list(y), marker="|", s=400, color="black", label="target", zorder=3)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("devrng time / peer time (lower is better)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(results: list[tuple[str, dict[str, Any]]]) -> str:
    parts = []
    for env, result in results:
        m = result["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        parts.append(f"### {env} environment\n\nPython {m['python']}, {m['cores']} cores "
                     f"({m['cpu']}); {versions}.\n\n{format_table(result['rows'])}\n")
    parts.append("![devrng / peer time ratio per case](benchmarks.png)\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    results = []
    for name in argv:
        env = Path(name).stem.removeprefix("results-")
        results.append((env, json.loads(Path(name).read_text())))
    page = DOCS / "benchmarks.md"
    text = page.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{BEGIN}\n{render(results)}\n{END}{tail}")
    chart(results, DOCS / "benchmarks.png")
    print(f"wrote {page} and {DOCS / 'benchmarks.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
