#!/usr/bin/env bash
# Run the benchmarks in the bench environment (torch 2.13 + Lightning) and the xla
# environment, then render docs/benchmarks.md and its charts (docs/benchmarks-<env>.png) and
# the cost table of docs/portable.md from the results, which benchmarks/results/ keeps
# (python -m benchmarks.report renders them again).
source "$(dirname "$0")/_venv.sh"
cd "$DEVRNG_ROOT"
out=$(mktemp -d)
bench=$(venv_for bench)
core=$(venv_for core)
xla=$(venv_for xla)
"$bench/bin/python" -m benchmarks.run --json "$out/results-bench.json" "$@"
PJRT_DEVICE=CPU "$xla/bin/python" -m benchmarks.run --json "$out/results-xla.json" "$@"
"$core/bin/python" -m benchmarks.bench_portable --json "$out/portable-core.json" "$@"
PJRT_DEVICE=CPU "$xla/bin/python" -m benchmarks.bench_portable --json "$out/portable-xla.json" "$@"
"$bench/bin/python" -m benchmarks.report "$out"/results-*.json "$out"/portable-*.json
