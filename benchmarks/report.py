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


def format_table(rows: list[Row], footnote_prefix: str = "") -> str:
    """Rows that ran as a markdown table; notes become footnotes and the cases this
    environment cannot run are named once below it instead of as empty rows."""
    lines = ["| case | devrng | peer | ratio | target | met |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    skipped: list[str] = []

    def note(text: str) -> str:
        notes.append(text)
        return f"[^{footnote_prefix}{len(notes)}]"

    for r in rows:
        if r.get("ms") is not None:
            met = "yes" if r["ms"] <= r["target_ms"] else "no"
            lines.append(f"| {r['case']} | {r['ms']:.1f} ms | - | - | ≤ 30 ms | {met} |")
            continue
        if r["ratio"] is None:
            skipped.append(f"{r['case']} ({r['note'].removeprefix('skipped: ')})")
            continue
        met = "-" if r["target"] is None else ("yes" if r["ratio"] <= r["target"] else "no")
        mark = note(r["note"]) if r.get("note") else ""
        lines.append(f"| {r['case']}{mark} | {_time(r['devrng_us'])} | {r['peer']}: "
                     f"{_time(r['peer_us'])} | {r['ratio']:.2f}× | {_target(r['target'])} | {met} |")
        if r.get("compiles") is not None and r["target"] is not None:  # seeded_jit: 50 seeds
            ok = "yes" if r["compiles"] <= r.get("target_compiles", 1) else "no"
            first = r.get("compiles_after_first_call")  # the count once the first call returned
            later = "" if first is None else f" ({r['compiles'] - first} after the first seed)"
            lines.append(f"| {r['case']}: compilations for 50 distinct seeds | "
                         f"{r['compiles']}{later} | - | - | {r.get('target_compiles', 1)} | {ok} |")
    if skipped:
        lines.append("")
        lines.append("Not run in this environment: " + "; ".join(skipped) + ".")
    if notes:
        lines.append("")
        lines += [f"[^{footnote_prefix}{i}]: {text}" for i, text in enumerate(notes, start=1)]
    return "\n".join(lines)


def _time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.2f} µs"


def _target(t: float | None) -> str:
    return "-" if t is None else f"≤ {t}×"


def chart(results: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    labels, ratios, targets = [], [], []
    for env, result in results:
        for r in result["rows"]:
            if r["ratio"] is not None and r["target"] is not None:
                labels.append(f"{r['case']} [{env}]")
                ratios.append(r["ratio"])
                targets.append(r["target"])
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(labels) + 1.6))
    y = list(range(len(labels)))
    met = [v <= t for v, t in zip(ratios, targets, strict=True)]
    ax.barh(y, ratios, color=["tab:green" if ok else "tab:red" for ok in met], height=0.6)
    ax.scatter(targets, y, marker="|", s=300, color="black", zorder=3)
    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.text(1.0, -0.9, " 1.0× = the peer's time", color="grey", fontsize=8, va="bottom")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max([*ratios, *targets, 1.0]) * 1.15)
    ax.set_ylim(len(labels) - 0.4, -1.2)
    ax.set_xlabel("devrng time / peer time (lower is better)")
    ax.set_title("devrng against its peers, same process, interleaved rounds (median ratio)")
    ax.legend(handles=[Patch(color="tab:green", label="target met"),
                       Patch(color="tab:red", label="target missed"),
                       plt.Line2D([], [], color="black", marker="|", linestyle="none",
                                  markersize=12, label="target")],
              loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def render(results: list[tuple[str, dict[str, Any]]]) -> str:
    parts = []
    for env, result in results:
        m = result["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        parts.append(f"### {env} environment\n\nPython {m['python']}, {m['cores']} cores "
                     f"({m['cpu']}); {versions}.\n\n{format_table(result['rows'], f'{env}-')}\n")
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
