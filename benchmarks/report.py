"""Render benchmark results (JSON files from benchmarks.run and benchmarks.bench_portable)
into docs/benchmarks.md, its charts and the cost table of docs/portable.md.

    python -m benchmarks.report results-bench.json portable-core.json ...   # new results
    python -m benchmarks.report                                             # again, saved

New results are kept in benchmarks/results/ (one file per environment and kind:
``results-<env>.json``, ``portable-<env>.json``), so the pages and charts can be
rendered again, after a change to this module, without running the benchmarks. Each
environment gets its table and its chart (docs/benchmarks-<env>.png); the portable
results get a table per environment in docs/benchmarks.md and one cost table with a
column per environment in docs/portable.md.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

Row = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SAVED = Path(__file__).resolve().parent / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
PORTABLE_BEGIN, PORTABLE_END = "<!-- portable:begin -->", "<!-- portable:end -->"
COSTS_BEGIN, COSTS_END = "<!-- costs:begin -->", "<!-- costs:end -->"


def format_table(rows: list[Row], footnote_prefix: str = "") -> str:
    """Rows that ran as a markdown table; notes become footnotes and the cases this
    environment cannot run are named once below it instead of as empty rows."""
    lines = ["| case | devrng | compared with | ratio | target |", "|---|---|---|---|---|"]
    notes: list[str] = []
    skipped: list[str] = []

    def note(text: str) -> str:
        notes.append(text)
        return f"[^{footnote_prefix}{len(notes)}]"

    for r in rows:
        if r.get("ms") is not None:
            target = _met(r["ms"] <= r["target_ms"], f"≤ {r['target_ms']:g} ms")
            lines.append(f"| {r['case']} | {r['ms']:.1f} ms | - | - | {target} |")
            continue
        if r.get("us") is not None:  # a time of its own, against a budget in µs
            target = _met(r["us"] <= r["target_us"], f"≤ {r['target_us']:g} µs")
            mark = note(r["note"]) if r.get("note") else ""
            lines.append(f"| {r['case']}{mark} | {_time(r['us'])} | - | - | {target} |")
            continue
        if r["ratio"] is None:
            skipped.append(f"{r['case']} ({r['note'].removeprefix('skipped: ')})")
            continue
        target = "-" if r["target"] is None else _met(r["ratio"] <= r["target"], _target(r["target"]))
        mark = note(r["note"]) if r.get("note") else ""
        lines.append(f"| {r['case']}{mark} | {_time(r['devrng_us'])} | {r['peer']}: "
                     f"{_time(r['peer_us'])} | {r['ratio']:.2f}× | {target} |")
        if r.get("compiles") is not None and r["target"] is not None:  # seeded_jit: 50 seeds
            first = r.get("compiles_after_first_call")  # the count once the first call returned
            later = "" if first is None else f" ({r['compiles'] - first} after the first seed)"
            want = r.get("target_compiles", 1)
            lines.append(f"| {r['case']}: compilations for 50 distinct seeds | "
                         f"{r['compiles']}{later} | - | - | "
                         f"{_met(r['compiles'] <= want, str(want))} |")
    if skipped:
        lines.append("")
        lines.append("Not run in this environment: " + "; ".join(skipped) + ".")
    if notes:
        lines.append("")
        lines += [f"[^{footnote_prefix}{i}]: {text}" for i, text in enumerate(notes, start=1)]
    return "\n".join(lines)


def format_grid(grid: list[Row]) -> str:
    """The portable grid (``bench_portable.bench_grid``) as one table: a row per op family and
    dtype, a column per size, each cell the ratio to torch on 1 thread / on 2 threads, in
    bold where it misses its target (4x below 2**16 elements, 1.5x from there)."""
    sizes = sorted({r["log2"] for r in grid})
    threads = sorted({r["threads"] for r in grid})
    cells: dict[tuple[str, str], dict[int, dict[int, Row]]] = {}
    for r in grid:
        cells.setdefault((r["family"], r["dtype"]), {}).setdefault(r["log2"], {})[r["threads"]] = r
    lines = ["| op | dtype | " + " | ".join(f"2**{k}" for k in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for (family, dtype), by_size in cells.items():
        row = []
        for k in sizes:
            runs = by_size.get(k, {})
            shown = [(f"{runs[t]['ratio']:.2f}" if runs[t]["ratio"] <= runs[t]["target"]
                      else f"**{runs[t]['ratio']:.2f}**") if t in runs else "-" for t in threads]
            row.append(" / ".join(shown) if runs else "-")
        lines.append(f"| {family} | {dtype} | " + " | ".join(row) + " |")
    missed = sum(r["ratio"] > r["target"] for r in grid)
    lines += ["", f"{len(grid)} cells, {missed} above their target."]
    return "\n".join(lines)


def _met(ok: bool, target: str) -> str:
    return f"{target}: met" if ok else f"{target}: **missed**"


def _time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.1f} s"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.2f} µs"


def _target(t: float | None) -> str:
    return "-" if t is None else f"≤ {t}×"


def chart_rows(result: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, ratio, target) for each row with a target; a label names the case and what it
    is compared with, and no two are the same."""
    out = [(f"{r['case']}\nvs {r['peer']}", r["ratio"], r["target"])
           for r in result["rows"] if r["ratio"] is not None and r["target"] is not None]
    labels = [label for label, _, _ in out]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"two chart bars would be labelled alike: {twice}; give the rows "
                         "distinct cases or peers.")
    return out


_PLAIN = {"facecolor": "white", "edgecolor": "none", "pad": 0.6}


def _figure(width: float, height: float) -> tuple[Any, Any]:
    """A matplotlib figure and its axes, drawn without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def _bar(ax: Any, y: float, ratio: float, target: float, height: float) -> bool:
    """One case's bar (green when the target is met) and its target mark; whether it is met."""
    met = ratio <= target
    ax.barh(y, ratio, height=height, color="#2e7d32" if met else "#c62828")
    ax.plot([target, target], [y - 0.75 * height, y + 0.75 * height], color="black", linewidth=2)
    return met


def _finish(fig: Any, ax: Any, path: Path, *, xmax: float, ylim: tuple[float, float],
            size: float, title_size: float, xlabel: str, title: str) -> None:
    """What both charts share: the 1.0 line, bare axes, the labels; then save and close."""
    import matplotlib.pyplot as plt

    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--", zorder=0)
    ax.set_xlim(0, xmax)
    ax.set_ylim(*ylim)
    ax.set_yticks([])
    ax.set_xlabel(xlabel, fontsize=size)
    ax.set_title(title, fontsize=title_size)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=200)
    plt.close(fig)


def chart(env: str, result: dict[str, Any], path: Path) -> None:
    """One bar per row with a target: devrng's time over the peer's, the target beside it.

    Sized for the docs column (7.5 in wide, labels above their bars rather than beside
    them), so that it is read at its own size rather than shrunk.
    """
    rows = chart_rows(result)
    top = max([1.0, *(max(v, t) for _, v, t in rows)])
    fig, ax = _figure(7.5, 0.85 * len(rows) + 1.0)
    for y, (label, ratio, target) in enumerate(rows):
        met = _bar(ax, y, ratio, target, 0.32)
        case, peer = label.split("\n", 1)
        # Above the bar, full width: what is measured, then what it is compared with
        # (on white, so that the 1.0 line does not run through the words).
        ax.text(0, y - 0.4, textwrap.shorten(case, 88), fontsize=9.5, va="bottom",
                fontweight="bold", bbox=_PLAIN)
        ax.text(0, y - 0.2, textwrap.shorten(peer, 96), fontsize=9, va="bottom",
                color="#555555", bbox=_PLAIN)
        verdict = "met" if met else "MISSED"
        ax.text(max(ratio, target) + top * 0.015, y, f"{ratio:.2f}×  (target ≤ {target:g}×, "
                f"{verdict})", fontsize=9, va="center")
    ax.text(1.0, -0.75, " 1.0×: as fast as the compared tool", color="grey", fontsize=8)
    _finish(fig, ax, path, xmax=top * 1.45, ylim=(len(rows) - 0.6, -1.05), size=8.5,
            title_size=10,
            xlabel="devrng's time / the compared tool's time (below 1.0: devrng is faster; "
                   "| marks the target)",
            title=f"{env} environment: devrng against the tools it replaces")


def _machine_line(m: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return f"Python {m['python']}, {m['cores']} cores ({m['cpu']}); {versions}."


NARROW = "(max-width: 44.9375em)"  # the site's phone layout (Material's breakpoint)


def narrow_chart(env: str, result: dict[str, Any], path: Path) -> None:
    """The same bars laid out for a phone's column (3.6 in wide, read at about 360 px):
    each case's words wrapped above its bar, the ratio and target on a line of their own."""
    rows = chart_rows(result)
    top = max([1.0, *(max(v, t) for _, v, t in rows)])
    blocks = []  # (label lines, ratio, target) with the label wrapped to the column
    for label, ratio, target in rows:
        case, peer = label.split("\n", 1)
        lines = [(line, "case") for line in textwrap.wrap(case, 40)]
        lines += [(line, "peer") for line in textwrap.wrap(peer, 44)]
        blocks.append((lines, ratio, target))
    step = 0.55  # one text line, in bar heights
    tight = {**_PLAIN, "pad": 0.1}  # a white box that does not cover the line above
    height = sum(len(lines) + 1 for lines, _, _ in blocks) * step + 1.25 * len(blocks)
    fig, ax = _figure(3.6, 0.21 * height + 0.9)
    y = 0.0
    for lines, ratio, target in blocks:
        for text, kind in lines:
            ax.text(0, y, text, fontsize=8, va="top", color="black" if kind == "case" else "#555555",
                    fontweight="bold" if kind == "case" else "normal", bbox=tight)
            y += step
        met = ratio <= target
        ax.text(0, y, f"{ratio:.2f}×: target ≤ {target:g}×, {'met' if met else 'MISSED'}",
                fontsize=8, va="top", color="#2e7d32" if met else "#c62828", bbox=tight)
        y += step + 0.35
        _bar(ax, y, ratio, target, 0.5)
        y += 0.9
    _finish(fig, ax, path, xmax=top * 1.1, ylim=(y - 0.3, -0.2), size=8, title_size=9,
            xlabel="devrng's time / the compared tool's\n(below 1.0: devrng is faster; "
                   "| the target)",
            title=f"{env} environment: devrng against\nthe tools it replaces")


def render(results: list[tuple[str, dict[str, Any]]]) -> str:
    parts = []
    for env, result in results:
        image, narrow = f"benchmarks-{env}.png", f"benchmarks-{env}-narrow.png"
        alt = f"{env} environment: devrng time / the compared tool's time, per case"
        # The div lets the site's stylesheet keep ratios and targets whole on a phone; a
        # phone gets the chart drawn for its column, not the wide one shrunk to a third.
        parts.append(f"### {env} environment\n\n{_machine_line(result['machine'])}\n\n"
                     f"<div class=\"bench-results\" markdown>\n\n"
                     f"{format_table(result['rows'], f'{env}-')}\n\n</div>\n\n"
                     f"<a href=\"../{image}\"><picture><source media=\"{NARROW}\" "
                     f"srcset=\"../{narrow}\"><img src=\"../{image}\" alt=\"{alt}\">"
                     "</picture></a>\n")
    return "\n".join(parts)


def render_portable(results: list[tuple[str, dict[str, Any]]]) -> str:
    """devrng.portable's table per environment (docs/benchmarks.md), and its grid of every op
    family, dtype, size and thread count where the run made one."""
    return "\n".join(f"#### {env} environment\n\n{_machine_line(result['machine'])}\n\n"
                     f"<div class=\"bench-results\" markdown>\n\n"
                     f"{format_table(result['rows'], f'p{env}-')}\n\n</div>\n"
                     + (_grid_section(env, result) if result.get("grid") else "")
                     for env, result in results)


def _grid_section(env: str, result: dict[str, Any]) -> str:
    load = result.get("load")
    during = "" if not load else (f" The machine's load average (1 minute) was "
                                  f"{load[0]:.1f} when the run started and {load[-1]:.1f} "
                                  f"when it ended.")
    return (f"\n##### Every op family and dtype, {env} environment\n\n"
            f"Portable's time over torch's own draw, medians of interleaved rounds, on 1 "
            f"thread / on 2 threads (`torch.set_num_threads`); in bold where it misses "
            f"its target (≤ 4× below 2\\*\\*16 elements, ≤ 1.5× from 2\\*\\*16).{during}\n\n"
            f"<div class=\"bench-results\" markdown>\n\n{format_grid(result['grid'])}"
            f"\n\n</div>\n")


def render_costs(results: list[tuple[str, dict[str, Any]]]) -> str:
    """One table, a column per environment: portable's time over the native draw's for each
    case that ran (docs/portable.md)."""
    ratios: dict[str, dict[str, float]] = {}
    for env, result in results:
        for r in result["rows"]:
            if r["ratio"] is not None:
                ratios.setdefault(r["case"].removeprefix("portable "), {})[env] = r["ratio"]
    envs = [env for env, _ in results]
    lines = ["| case | " + " | ".join(f"{env} environment" for env in envs) + " |",
             "|---|" + "---|" * len(envs)]
    for case, by_env in ratios.items():
        cells = [f"{by_env[env]:.2f}×" if env in by_env else "-" for env in envs]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _replace(page: Path, begin: str, end: str, body: str) -> None:
    text = page.read_text()
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    page.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def _load(files: list[Path], save: bool) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The results of each kind ("results", "portable"), per environment, in file order."""
    kinds: dict[str, list[tuple[str, dict[str, Any]]]] = {"results": [], "portable": []}
    for path in files:
        kind, _, env = path.stem.partition("-")
        if kind not in kinds:
            raise ValueError(f"{path.name}: results files are named results-<env>.json or "
                             "portable-<env>.json")
        data = json.loads(path.read_text())
        kinds[kind].append((env, data))
        if save:  # keep new results, so that the pages can be rendered again without a run
            SAVED.mkdir(exist_ok=True)
            (SAVED / path.name).write_text(json.dumps(data, indent=1) + "\n")
    return kinds


def main(argv: list[str]) -> int:
    files = [Path(name) for name in argv] or sorted(
        [*SAVED.glob("results-*.json"), *SAVED.glob("portable-*.json")])
    if not files:
        print(f"no results given and none saved in {SAVED}; run scripts/bench.sh", file=sys.stderr)
        return 1
    kinds = _load(files, save=bool(argv))
    page = DOCS / "benchmarks.md"
    if kinds["results"]:
        _replace(page, BEGIN, END, render(kinds["results"]))
        for env, result in kinds["results"]:
            chart(env, result, DOCS / f"benchmarks-{env}.png")
            narrow_chart(env, result, DOCS / f"benchmarks-{env}-narrow.png")
    if kinds["portable"]:
        _replace(page, PORTABLE_BEGIN, PORTABLE_END, render_portable(kinds["portable"]))
        _replace(DOCS / "portable.md", COSTS_BEGIN, COSTS_END, render_costs(kinds["portable"]))
    print(f"wrote {page}, its charts and the costs in docs/portable.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
