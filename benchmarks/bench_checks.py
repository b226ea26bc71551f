"""What ``devrng check-determinism`` costs: the whole check against plain runs of the script,
and one training step with every op recorded (its locating runs) against the plain step.

    python -m benchmarks.bench_checks [--quick]

The check's rows are wall-clock times of subprocesses (the script is
examples/why_runs_differ.py, ``--steps`` steps), the median of a few rounds in which the
check and a plain run take turns; the step's row is interleaved in one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import interleaved

Row = dict[str, Any]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "why_runs_differ.py"


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def bench_recorded_step(number: int, rounds: int) -> list[Row]:
    """One training step of an MNIST-sized CNN (batch 64) with every op recorded."""
    from devrng._checks.ops import Ops

    model = _cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def recorded() -> None:
        with Ops():
            step()

    m = interleaved({"on": recorded, "off": step}, number=number, rounds=rounds)
    return [{"case": "check-determinism: one CNN step with every op recorded (batch 64, CPU)",
             "devrng_us": m["on"], "peer": "the same step", "peer_us": m["off"],
             "ratio": m["on"] / m["off"], "target": None,
             "note": "only the step that differed, in the two locating runs"}]


def _wall(command: list[str], cwd: str, code: int = 0) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, check=False, capture_output=True, text=True,
                          env={**os.environ, "DEVRNG_SEED": "0"})
    took = time.perf_counter() - started
    if proc.returncode != code:  # a check that failed early is not a time
        raise RuntimeError(f"{command} exited with {proc.returncode}, not {code}:\n"
                           f"{proc.stdout}{proc.stderr}")
    return took


def bench_check(steps: int, rounds: int) -> list[Row]:
    """The whole check (two runs; with --unordered-sum also the two locating runs) against
    one plain run of the same script for the same steps."""
    python = sys.executable
    plain = [python, str(EXAMPLE), "--epochs", "1"]
    rows = []
    for flags, what in (([], "runs that match"), (["--unordered-sum"], "a located op")):
        check = [python, "-m", "devrng", "check-determinism", "--steps", str(steps), "--",
                 *plain, *flags]
        times: dict[str, list[float]] = {"check": [], "plain": []}
        with tempfile.TemporaryDirectory() as cwd:
            for _ in range(rounds):
                times["check"].append(_wall(check, cwd, 1 if flags else 0))
                times["plain"].append(_wall([*plain, *flags], cwd))
        ours, theirs = statistics.median(times["check"]), statistics.median(times["plain"])
        rows.append({"case": f"check-determinism --steps {steps}, {what}",
                     "devrng_us": ours * 1e6, "peer": "one plain run of the script",
                     "peer_us": theirs * 1e6, "ratio": ours / theirs, "target": None,
                     "note": "wall clock, processes started included"})
    return rows


def run(quick: bool = False) -> list[Row]:
    number, rounds = (2, 2) if quick else (20, 9)
    rows = bench_recorded_step(number, rounds)
    if not quick:  # (subprocesses: seconds each)
        rows += bench_check(12, 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from benchmarks.report import format_table

    print(format_table(run(quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
