"""devrng.portable against the native generators and JAX, timed interleaved in one process.

    python -m benchmarks.bench_portable [--quick] [--json portable-<env>.json]

- eager CPU, every op family on 2**20 elements (rand and randn in float32 and
  float64, randn in bfloat16, randint, uniform_ and normal_ with bounds,
  exponential_, bernoulli_, dropout; randperm and multinomial for information),
  inside ``portable`` vs plain torch (target 1.5x: the same numbers everywhere
  cost a counter-based generator, here the fused CPU kernel);
- the same without the C kernel (``DEVRNG_CPU_KERNEL=0``, as after an install
  without a compiler: the tensor ops), in a child process (no target: it says
  what that costs);
- against the anchor: portable ``torch.rand(2**20)`` vs ``jax.jit`` of
  ``jax.random.uniform`` for the same shape on the CPU (target 1.5x; needs JAX);
- a training step of an MLP with dropout (256 wide, batch 128) under
  ``torch.compile`` (inductor) and as an XLA graph (torch_xla, lazy tensors and
  ``torch_xla.sync()``), portable vs native dropout (target 1.3x), with the
  compilations seen for 50 seeds x 10 steps (target 1);
- the first call of that step under ``torch.compile`` (inductor), which compiles it:
  portable vs native, each in a fresh process with an empty inductor cache (target 1.5x).

``--quick`` uses tiny counts and skips inductor (tens of seconds to compile).
``--json`` writes the rows and the machine, which ``benchmarks.report`` renders into
docs/benchmarks.md and the cost table of docs/portable.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import devrng
from benchmarks.timing import interleaved

Row = dict[str, Any]
N = 1 << 20
WIDTH, BATCH = 256, 128
SEEDS, STEPS = 50, 10
TARGET = 1.5  # every eager op family against torch's own draw on the CPU (issue 39)


def _row(case: str, target: float | None, ours: float, peer_name: str, peer: float,
         note: str = "") -> Row:
    return {"case": case, "devrng_us": ours, "peer": peer_name, "peer_us": peer,
            "ratio": ours / peer, "target": target, "note": note}


def _skipped(case: str, peer: str, why: str, target: float) -> Row:
    return {"case": case, "devrng_us": None, "peer": peer, "peer_us": None, "ratio": None,
            "target": target, "note": f"skipped: {why}"}


def ops(n: int) -> list[tuple[str, Callable[[], object], float | None]]:
    """Every op family on ``n`` elements: (what, the call, target). Each runs inside portable
    and as plain torch; randperm and multinomial are for information (JAX's permutation
    sorts by random keys, devrng's multinomial scans prefix sums: not a fused loop)."""
    size = f"2**{n.bit_length() - 1}"
    x, w = torch.ones(n), torch.rand(1000)
    return [
        (f"torch.rand({size})", lambda: torch.rand(n), TARGET),
        (f"torch.rand({size}, dtype=float64)", lambda: torch.rand(n, dtype=torch.float64),
         TARGET),
        (f"torch.randn({size})", lambda: torch.randn(n), TARGET),
        (f"torch.randn({size}, dtype=float64)", lambda: torch.randn(n, dtype=torch.float64),
         TARGET),
        (f"torch.randn({size}, dtype=bfloat16)", lambda: torch.randn(n, dtype=torch.bfloat16),
         TARGET),
        (f"torch.randint(0, 1000, ({size},))", lambda: torch.randint(0, 1000, (n,)), TARGET),
        (f"Tensor.uniform_(-0.1, 0.1) on {size} (nn.init's uniform draws)",
         lambda: torch.empty(n).uniform_(-0.1, 0.1), TARGET),
        (f"Tensor.normal_(0, 0.02) on {size} (nn.init's normal draws)",
         lambda: torch.empty(n).normal_(0.0, 0.02), TARGET),
        (f"Tensor.exponential_() on {size}", lambda: torch.empty(n).exponential_(), TARGET),
        (f"Tensor.bernoulli_(0.3) on {size}", lambda: torch.empty(n).bernoulli_(0.3), TARGET),
        (f"F.dropout(x, 0.5) on {size}", lambda: F.dropout(x, 0.5), TARGET),
        (f"torch.randperm({size})", lambda: torch.randperm(n), None),
        (f"torch.multinomial(1000 weights, {size}, replacement=True)",
         lambda: torch.multinomial(w, n, True), None),
    ]


# The op families the no-kernel rows measure (the tensor ops behind every op above).
NO_KERNEL = ("torch.rand(", "torch.randn(", "torch.randint(", "F.dropout(")


def _one_thread() -> Callable[[], None]:
    # One intra-op thread: torch's draws are single-threaded anyway, and on a shared 2-core
    # machine threads waiting on each other swing the elementwise ops around them.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(threads)


def _eager_rows(n: int, number: int, rounds: int, *, kernel: bool) -> list[Row]:
    rng = devrng.portable(0)
    rows = []
    restore = _one_thread()
    try:
        for name, call, goal in ops(n):
            if not kernel and not name.startswith(NO_KERNEL):
                continue

            def ours(call: Callable[[], object] = call) -> object:
                with rng:
                    return call()

            m = interleaved({"ours": ours, "peer": call}, number=number, rounds=rounds)
            where = ", eager CPU" if kernel else ", eager CPU, without the C kernel"
            rows.append(_row(f"portable {name}{where}", goal if kernel else None, m["ours"],
                             "the same call with torch's generator", m["peer"]))
    finally:
        restore()
    if not kernel:
        rows[0]["note"] = ("informational: the same numbers from tensor ops (no C compiler "
                           "at install time, or DEVRNG_CPU_KERNEL=0), for this and the rows "
                           "below marked without the C kernel")
    return rows


def bench_eager_cpu(n: int, number: int, rounds: int) -> list[Row]:
    return _eager_rows(n, number, rounds, kernel=True)


def bench_no_kernel(n: int, number: int, rounds: int) -> list[Row]:
    """The eager rows again in a child process without the C kernel (DEVRNG_CPU_KERNEL=0):
    what an install without a C compiler gets."""
    code = (f"import json; from benchmarks.bench_portable import no_kernel_rows; "
            f"print(json.dumps(no_kernel_rows({n}, {number}, {rounds})))")
    env = {**os.environ, "DEVRNG_CPU_KERNEL": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, timeout=3600, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def no_kernel_rows(n: int, number: int, rounds: int) -> list[Row]:
    """Run by ``bench_no_kernel`` in the child process."""
    from devrng._portable.threefry_cpu import status

    if status()[0]:
        raise RuntimeError("the C kernel is in use; run with DEVRNG_CPU_KERNEL=0")
    return _eager_rows(n, number, rounds, kernel=False)


# -- every op family and dtype, at every size, on 1 and 2 threads (issue 46) -----------------
GRID_SIZES = (10, 12, 16, 20, 24)  # log2 of the number of elements
GRID_THREADS = (1, 2)
SMALL, SMALL_TARGET = 16, 4.0  # below 2**16 elements a draw's fixed cost counts: 4x
FLOATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}

Make = Callable[[int], Callable[[], object]]


def _in_place(dtype: torch.dtype, fill: Callable[[torch.Tensor], object]) -> Make:
    def make(n: int) -> Callable[[], object]:
        t = torch.empty(n, dtype=dtype)
        return lambda: fill(t)

    return make


def grid_ops() -> list[tuple[str, str, Make]]:
    """(op family, dtype, make(n) -> the call on n elements): each family
    in every dtype torch draws it in. In-place draws fill one tensor made beforehand."""
    cases: list[tuple[str, str, Make]] = []
    for name, dt in FLOATS.items():
        cases += [
            ("torch.rand(n)", name, lambda n, dt=dt: lambda: torch.rand(n, dtype=dt)),
            ("torch.randn(n)", name, lambda n, dt=dt: lambda: torch.randn(n, dtype=dt)),
            ("uniform_(-0.1, 0.1)", name, _in_place(dt, lambda t: t.uniform_(-0.1, 0.1))),
            ("normal_(0, 0.02)", name, _in_place(dt, lambda t: t.normal_(0.0, 0.02))),
            ("exponential_()", name, _in_place(dt, lambda t: t.exponential_())),
            ("bernoulli_(0.3)", name, _in_place(dt, lambda t: t.bernoulli_(0.3))),
            ("F.dropout(x, 0.5)", name,
             lambda n, dt=dt: (lambda x: lambda: F.dropout(x, 0.5))(torch.ones(n, dtype=dt))),
        ]
    w = torch.rand(1000)
    cases += [
        ("torch.randint(0, 1000, (n,))", "int64", lambda n: lambda: torch.randint(0, 1000, (n,))),
        ("torch.randperm(n)", "int64", lambda n: lambda: torch.randperm(n)),
        ("torch.multinomial(1000 weights, n, True)", "int64",
         lambda n: lambda: torch.multinomial(w, n, True)),
    ]
    return cases


def bench_grid(sizes: tuple[int, ...] = GRID_SIZES, threads: tuple[int, ...] = GRID_THREADS,
               rounds: int = 5) -> list[Row]:
    """Portable against torch's own draw for every op family and dtype of ``grid_ops``, at
    2**k elements for k in ``sizes``, on each count of intra-op ``threads``: medians of
    ``rounds`` interleaved rounds, each of as many calls as make about 2**20 elements."""
    rng = devrng.portable(0)
    before = torch.get_num_threads()
    rows = []
    try:
        for count in threads:
            torch.set_num_threads(count)
            for family, dtype, make in grid_ops():
                for k in sizes:
                    call = make(1 << k)

                    def ours(call: Callable[[], object] = call) -> object:
                        with rng:
                            return call()

                    number = max(1, min(200, (1 << 20) >> k))
                    m = interleaved({"ours": ours, "peer": call}, number=number, rounds=rounds)
                    rows.append({"family": family, "dtype": dtype, "log2": k, "threads": count,
                                 "devrng_us": m["ours"], "peer_us": m["peer"],
                                 "ratio": m["ours"] / m["peer"],
                                 "target": SMALL_TARGET if k < SMALL else TARGET})
    finally:
        torch.set_num_threads(before)
    return rows


_FIRST_DRAW = """
import sys, time
import torch, devrng
torch.set_num_threads(1)
start = time.perf_counter()
if sys.argv[1] == "portable":
    with devrng.portable(0):
        torch.rand(1)
elif sys.argv[1] == "kernel check":
    from devrng._portable.threefry_cpu import kernel
    kernel()
else:
    torch.rand(1)
print(time.perf_counter() - start)
"""
FIRST_DRAW_TARGET_MS = 50.0


def bench_first_draw(processes: int = 7) -> list[Row]:
    """The first portable draw after ``import torch, devrng`` in a fresh process (the lazy
    imports, the kernel's checks and the draw), against torch's first ``torch.rand(1)``, and
    the kernel's checks alone: medians over ``processes`` processes of each, interleaved."""
    root = Path(__file__).resolve().parent.parent
    kinds = ("portable", "kernel check", "native")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(processes):
        for kind in kinds:
            out = subprocess.run([sys.executable, "-c", _FIRST_DRAW, kind], cwd=root,
                                 capture_output=True, text=True, check=True)
            times[kind].append(float(out.stdout.strip().splitlines()[-1]) * 1e3)
    median = {kind: statistics.median(values) for kind, values in times.items()}
    return [
        {"case": f"first portable draw in a fresh process: `with devrng.portable(0): "
                 f"torch.rand(1)` after `import torch, devrng` (median of {processes} "
                 f"processes; torch's first `torch.rand(1)`: {median['native']:.2f} ms)",
         "ms": median["portable"], "target_ms": FIRST_DRAW_TARGET_MS, "ratio": None,
         "target": None, "note": ""},
        {"case": f"of which the C kernel's checks alone (SHA-256 and known answers; median "
                 f"of {processes} processes)",
         "ms": median["kernel check"], "target_ms": FIRST_DRAW_TARGET_MS, "ratio": None,
         "target": None, "note": ""},
    ]


def bench_eager_step(number: int, rounds: int) -> list[Row]:
    """An eager training step of a small MLP with dropout: inside portable every torch call
    of the step passes through the stream's Python handler (informational: no target)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(64, 64))
    step = _step_fn(model)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    rng = devrng.portable(0)

    def ours() -> object:
        with rng:
            return step(x, y)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = interleaved({"ours": ours, "peer": lambda: step(x, y)}, number=number * 20,
                        rounds=rounds)
    finally:
        torch.set_num_threads(threads)
    return [_row("eager training step, 64x64 MLP with dropout, CPU", None, m["ours"],
                 "the same step with torch's dropout", m["peer"],
                 note="informational: every torch call inside portable passes through its "
                      "Python handler (a few microseconds each); small eager steps feel it")]


def bench_jax_anchor(number: int, rounds: int) -> list[Row]:
    case = "portable torch.rand(2**20) vs JAX, CPU"
    peer = "jax.jit(jax.random.uniform)(key, (2**20,))"
    if importlib.util.find_spec("jax") is None:
        return [_skipped(case, peer, "JAX is not installed here (xla env)", 1.5)]
    import jax

    uniform = jax.jit(lambda key: jax.random.uniform(key, (N,)))
    keys = [jax.random.fold_in(jax.random.key(0), i) for i in range(8)]
    counter = [0]

    def peer_call() -> object:
        counter[0] += 1
        return jax.block_until_ready(uniform(keys[counter[0] % 8]))

    rng = devrng.portable(0)

    def ours() -> object:
        with rng:
            return torch.rand(N)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = interleaved({"ours": ours, "peer": peer_call}, number=number, rounds=rounds)
    finally:
        torch.set_num_threads(threads)
    return [_row(case, 1.5, m["ours"], peer, m["peer"],
                 note="the same Threefry arithmetic: XLA's CPU code against devrng's C loop "
                      "(one thread)")]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Dropout(0.1), torch.nn.Linear(WIDTH, WIDTH))


def _step_fn(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.01 * p.grad)
                p.grad = None
        return loss.detach()

    return step


def bench_inductor(number: int, rounds: int) -> list[Row]:
    import torch._inductor.config as inductor_config
    from torch._dynamo.testing import CompileCounterWithBackend

    inductor_config.fx_graph_cache = False  # no graph from an earlier run's on-disk cache
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    native_counter = CompileCounterWithBackend("inductor")
    ours_counter = CompileCounterWithBackend("inductor")
    native = torch.compile(_step_fn(_mlp()), backend=native_counter)
    ours = torch.compile(_step_fn(_mlp()), backend=ours_counter)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with devrng.portable(0):  # compiles (timed on its own by bench_first_compile)
            ours(x, y)
        native(x, y)
        for seed in range(SEEDS):  # 50 seeds x 10 steps: every one a runtime input
            with devrng.portable(seed):
                for _ in range(STEPS):
                    ours(x, y)
        rng = devrng.portable(1)

        def ours_call() -> object:
            with rng:
                return ours(x, y)

        m = interleaved({"ours": ours_call, "peer": lambda: native(x, y)}, number=number,
                        rounds=rounds)
    finally:
        torch.set_num_threads(threads)
    return [_row("MLP training step with dropout, torch.compile (inductor), CPU", 1.3,
                 m["ours"], "the same step with torch's dropout", m["peer"],
                 note=f"graphs compiled for {SEEDS} seeds x {STEPS} steps: "
                      f"{ours_counter.frame_count} (native: {native_counter.frame_count})")]


_FIRST_CALL = """
import sys, time, torch, devrng
from benchmarks.bench_portable import BATCH, WIDTH, _mlp, _step_fn
torch.set_num_threads(1)
x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
step = torch.compile(_step_fn(_mlp()), backend="inductor")
start = time.perf_counter()
if sys.argv[1] == "portable":
    with devrng.portable(0):
        step(x, y)
else:
    step(x, y)
print(time.perf_counter() - start)
"""


def _first_call_seconds(kind: str, root: Path) -> float:
    """The first (compiling) call of the step, in a fresh process with its own empty
    inductor cache: nothing compiled before, by this run or an earlier one, is reused."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
               "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
        out = subprocess.run([sys.executable, "-c", _FIRST_CALL, kind], cwd=root, env=env,
                             capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_first_compile(rounds: int = 2) -> list[Row]:
    """Portable vs native first compiled call, alternating which goes first; the best of
    ``rounds`` for each (in seconds, reported in the us columns' unit as us)."""
    root = Path(__file__).resolve().parent.parent
    best = {"portable": float("inf"), "native": float("inf")}
    for r in range(rounds):
        for kind in (("portable", "native") if r % 2 == 0 else ("native", "portable")):
            best[kind] = min(best[kind], _first_call_seconds(kind, root))
    return [_row("first call of the MLP step under torch.compile (inductor, compiling it), "
                 "each in a fresh process", 1.5, best["portable"] * 1e6,
                 "the same step with torch's dropout", best["native"] * 1e6,
                 note=f"portable {best['portable']:.1f} s, native {best['native']:.1f} s; "
                      f"best of {rounds}, empty inductor cache")]


def _xla_compiles() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def bench_xla(number: int, rounds: int) -> list[Row]:
    case = "MLP training step with dropout, XLA graph (torch_xla, PJRT CPU)"
    if importlib.util.find_spec("torch_xla") is None:
        return [_skipped(case, "the same step with torch_xla's dropout",
                         "torch_xla is not installed here (xla env)", 1.3)]
    import torch_xla

    device = torch_xla.device()
    x, y = torch.randn(BATCH, WIDTH).to(device), torch.randn(BATCH, WIDTH).to(device)
    torch_xla.sync()
    native_step, ours_step = _step_fn(_mlp().to(device)), _step_fn(_mlp().to(device))

    def native() -> object:
        out = native_step(x, y)
        torch_xla.sync()
        return out

    def ours_plain() -> object:
        out = ours_step(x, y)
        torch_xla.sync()
        return out

    t0 = time.perf_counter()
    with devrng.portable(0):
        ours_plain()
    first_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    native()
    first_native = time.perf_counter() - t0
    before = _xla_compiles()
    for seed in range(SEEDS):
        with devrng.portable(seed):
            for _ in range(STEPS):
                ours_plain()
    compiles = _xla_compiles() - before
    rng = devrng.portable(1)

    def ours() -> object:
        with rng:
            return ours_plain()

    m = interleaved({"ours": ours, "peer": native}, number=number, rounds=rounds)
    return [_row(case, 1.3, m["ours"], "the same step with torch_xla's dropout", m["peer"],
                 note=f"XLA compilations for {SEEDS} seeds x {STEPS} steps after the first "
                      f"step: {compiles} (the first step compiles the graph once); first "
                      f"step {first_ours:.2f} s, native {first_native:.2f} s")]


def run(quick: bool = False) -> list[Row]:
    number, rounds = (2, 3) if quick else (10, 11)
    rows: list[Row] = []
    has_xla = importlib.util.find_spec("torch_xla") is not None
    if has_xla:
        import torch_xla

        torch_xla.device()  # before the first backward pass (see bench_jit)
    n = 1 << 14 if quick else N  # quick: a smoke run, not a measurement
    rows += bench_eager_cpu(n, number, rounds)
    rows += bench_no_kernel(n, max(1, number // 5), rounds)
    rows += bench_eager_step(number, rounds)
    rows += bench_jax_anchor(number, rounds)
    if quick:
        rows.append(_skipped("MLP training step with dropout, torch.compile (inductor), CPU",
                             "the same step with torch's dropout",
                             "quick mode (inductor compiles for tens of seconds here)", 1.3))
    else:
        rows += bench_inductor(number * 10, rounds)
        rows += bench_first_compile()
    rows += bench_xla(number, rounds)
    rows += bench_first_draw(2 if quick else 7)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="devrng.portable against native draws and JAX")
    parser.add_argument("--quick", action="store_true", help="tiny iteration counts, no inductor")
    parser.add_argument("--json", help="also write the results here (portable-<env>.json)")
    args = parser.parse_args(argv)
    from benchmarks.report import format_grid, format_table
    from benchmarks.run import machine

    load = [os.getloadavg()[0]]
    rows = run(quick=args.quick)
    grid = bench_grid((10,), (1,), rounds=1) if args.quick else bench_grid()
    load.append(os.getloadavg()[0])
    print(format_table(rows))
    print(format_grid(grid))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "rows": rows, "grid": grid, "load": load}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
