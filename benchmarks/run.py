"""devrng against its peers: one command, one process per environment, ratios per case.

    python -m benchmarks.run [--quick] [--json out.json]

Cases that need what this environment lacks (torch_xla, Lightning) are reported as
skipped with the reason. ``scripts/bench.sh`` runs this and ``benchmarks.bench_portable``
(devrng.portable's draws, long enough to run on their own) in the bench and xla
environments and renders docs/benchmarks.md, its charts and docs/portable.md's costs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import statistics
import subprocess
import sys
from typing import Any

import torch

import devrng
from benchmarks.report import format_table
from benchmarks.timing import interleaved

Row = dict[str, Any]

_gen = torch.default_generator


def _row(case: str, target: float | None, ours: float, peer_name: str, peer: float,
         note: str = "") -> Row:
    return {"case": case, "devrng_us": ours, "peer": peer_name, "peer_us": peer,
            "ratio": ours / peer, "target": target, "note": note}


def _skipped(case: str, peer: str, why: str, target: float | None = None) -> Row:
    return {"case": case, "devrng_us": None, "peer": peer, "peer_us": None, "ratio": None,
            "target": target, "note": f"skipped: {why}"}


def bench_fork_cpu(number: int, rounds: int) -> list[Row]:
    def ours() -> None:
        with devrng.fork_rng(devices=[]):
            pass

    def peer() -> None:
        with torch.random.fork_rng(devices=[]):
            pass

    def floor() -> None:
        _gen.set_state(_gen.get_state())

    m = interleaved({"ours": ours, "peer": peer, "floor": floor}, number=number, rounds=rounds)
    return [
        _row("fork_rng(devices=[])", 0.8, m["ours"], "torch.random.fork_rng(devices=[])", m["peer"]),
        _row("fork_rng(devices=[])", 1.5, m["ours"], "floor: get_state + set_state", m["floor"]),
    ]


def bench_fork_host(number: int, rounds: int) -> list[Row]:
    case = "fork_rng(devices=[], python=True, numpy=True)"
    if importlib.util.find_spec("lightning") is None:
        return [_skipped(case, "Lightning isolate_rng(include_cuda=False)",
                         "Lightning is not installed here (it is in the bench env)", 0.95)]
    from lightning.pytorch.utilities.seed import isolate_rng

    def ours() -> None:
        with devrng.fork_rng(devices=[], python=True, numpy=True):
            pass

    def peer() -> None:
        with isolate_rng(include_cuda=False):
            pass

    m = interleaved({"ours": ours, "peer": peer}, number=number, rounds=rounds)
    return [_row(case, 0.95, m["ours"], "Lightning isolate_rng(include_cuda=False)", m["peer"])]


def bench_fork_xla(number: int, rounds: int) -> list[Row]:
    case = "fork_rng(devices=[xla_tensor])"
    peer_name = "torch.random.fork_rng(devices=[]) inside xm.fork_rng()"
    if importlib.util.find_spec("torch_xla") is None:
        return [_skipped(case, peer_name, "torch_xla is not installed here (xla env)", 0.7)]
    import torch_xla.core.xla_model as xm

    x = torch.ones(2, device="xla:0")

    def ours() -> None:
        with devrng.fork_rng(devices=[x]):
            pass

    def peer() -> None:
        with xm.fork_rng(), torch.random.fork_rng(devices=[]):
            pass

    m = interleaved({"ours": ours, "peer": peer}, number=number, rounds=rounds)
    return [_row(case, 0.7, m["ours"], peer_name, m["peer"])]


class _SimulatedCuda:
    """The RNG surface of ``torch.cuda`` for ``count`` SIMULATED devices, each a real
    torch.Generator (as the test suite simulates devices this machine lacks)."""

    def __init__(self, count: int) -> None:
        self.gens = [torch.Generator().manual_seed(i) for i in range(count)]

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.gens)

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, device: int = 0) -> torch.Tensor:
        return self.gens[device].get_state()

    def set_rng_state(self, state: torch.Tensor, device: int = 0) -> None:
        self.gens[device].set_state(state)


def bench_fork_indices(number: int, rounds: int, counts: tuple[int, ...]) -> list[Row]:
    """The call torch.utils.checkpoint makes through patch_torch(): a new fork per layer,
    ``fork_rng(devices=[0, ...], enabled=True, device_type="cuda")``, against the floor:
    the get/set calls of the same generators through devrng's backend, on 1..64
    SIMULATED CUDA devices."""
    rows = []
    saved = {name: getattr(torch.cuda, name) for name in (
        "is_available", "is_initialized", "device_count", "current_device", "get_rng_state",
        "set_rng_state")}
    backend = devrng.get_backend("cuda")
    try:
        for count in counts:
            fake = _SimulatedCuda(count)
            for name in saved:
                setattr(torch.cuda, name, getattr(fake, name))
            indices = list(range(count))

            def ours(indices: list[int] = indices) -> None:
                with devrng.fork_rng(devices=indices, enabled=True, device_type="cuda"):
                    pass

            def floor(indices: list[int] = indices) -> None:
                cpu = _gen.get_state()
                states = [backend.get_rng_state(i) for i in indices]
                for i, state in zip(indices, states, strict=True):
                    backend.set_rng_state(state, i)
                _gen.set_state(cpu)

            m = interleaved({"ours": ours, "floor": floor}, number=max(1, number // count),
                            rounds=rounds)
            case = ("fork_rng(devices=[0], device_type='cuda'), 1 SIMULATED device (checkpoint's "
                    "call)" if count == 1 else
                    f"fork_rng(devices=[0..{count - 1}], device_type='cuda'), {count} SIMULATED "
                    "devices")
            rows.append(_row(case, 1.5, m["ours"], "floor: the backend's get/set of each "
                             "generator, and the CPU's", m["floor"]))
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
    return rows


def bench_infer(number: int, rounds: int, sizes: tuple[int, ...]) -> list[Row]:
    from torch.utils._pytree import tree_leaves

    rows = []
    for n in sizes:
        half = [torch.zeros(1) for _ in range(n // 2)]
        tree = {"params": half, "buffers": ([torch.zeros(1) for _ in range(n - n // 2)],)}
        m = interleaved({"ours": lambda t=tree: devrng.infer_device_types(t),
                         "peer": lambda t=tree: tree_leaves(t)},
                        number=max(1, number // n), rounds=rounds)
        rows.append(_row(f"infer_device_types, {n:,} tensors", 2.0, m["ours"],
                         "torch.utils._pytree.tree_leaves", m["peer"]))
    return rows


def bench_snapshot(number: int, rounds: int) -> list[Row]:
    import numpy as np

    # devices=[]: the same generators as the raw calls (in the xla environment a bare
    # snapshot would also cover XLA and torchax, which are in use there).
    def ours_full() -> None:
        devrng.set_rng_state(devrng.get_rng_state(devices=[]))

    def raw_full() -> None:
        cpu, py, st = _gen.get_state(), random.getstate(), np.random.get_state(legacy=False)
        np.random.set_state(st)
        random.setstate(py)
        _gen.set_state(cpu)

    def ours_cpu() -> None:
        devrng.set_rng_state(devrng.get_rng_state(devices=[], python=False, numpy=False))

    def raw_cpu() -> None:
        _gen.set_state(_gen.get_state())

    m = interleaved({"ours_full": ours_full, "raw_full": raw_full}, number=number // 10,
                    rounds=rounds)
    c = interleaved({"ours_cpu": ours_cpu, "raw_cpu": raw_cpu}, number=number, rounds=rounds)
    return [
        _row("get_rng_state + set_rng_state (cpu, python, numpy)", 1.2, m["ours_full"],
             "the raw get/set calls it wraps", m["raw_full"]),
        _row("get_rng_state + set_rng_state (cpu only)", None, c["ours_cpu"],
             "torch get_state + set_state", c["raw_cpu"],
             note="informational: validation and the frozen snapshot object are fixed costs"),
    ]


def bench_import(runs: int) -> list[Row]:
    """``import devrng`` on top of ``import torch``, in fresh interpreters (milliseconds)."""
    def timed(code: str) -> float:
        script = (f"import time; t = time.perf_counter(); {code}; "
                  "print((time.perf_counter() - t) * 1e3)")
        out = subprocess.run([sys.executable, "-c", "import torch; " + script],
                             capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    extra = [timed("import devrng") for _ in range(runs)]
    ms = statistics.median(extra)
    return [{"case": "import devrng after import torch", "devrng_us": ms * 1e3, "peer": "-",
             "peer_us": None, "ratio": None, "target": None,
             "note": f"{ms:.1f} ms (target <= 30 ms)", "ms": ms, "target_ms": 30.0}]


def bench_training(quick: bool) -> list[Row]:
    from benchmarks import bench_training

    return bench_training.run(quick)


def bench_jit(quick: bool) -> list[Row]:
    try:
        from benchmarks import bench_jit
    except ImportError as err:
        return [_skipped("seeded_jit per-call overhead", "bare compiled function", str(err))]
    return bench_jit.run(quick)


def run(quick: bool = False) -> dict[str, Any]:
    number, rounds = (200, 3) if quick else (20_000, 15)
    rows: list[Row] = []
    rows += bench_fork_cpu(number, rounds)
    rows += bench_fork_host(number // 20, rounds)
    rows += bench_fork_xla(number // 10, rounds)
    rows += bench_fork_indices(number // 4, rounds, (1,) if quick else (1, 4, 16, 64))
    rows += bench_infer(number * 5, rounds, (1_000,) if quick else (1_000, 10_000))
    rows += bench_snapshot(number, rounds)
    rows += bench_import(1 if quick else 9)
    rows += bench_training(quick)
    rows += bench_jit(quick)
    return {"machine": machine(), "rows": rows}


def machine() -> dict[str, Any]:
    """Python, CPU, cores and package versions, as the report prints them."""
    versions = {}
    for name in ("torch", "numpy", "torch_xla", "torchax", "jax", "lightning"):
        try:
            from importlib.metadata import version

            versions[name] = version(name.replace("_", "-"))
        except Exception:
            pass
    import os

    return {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "versions": versions, "devrng": devrng.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    print(format_table(result["rows"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
