"""seeded_jit against the bare compiled function, per backend, at a 64x64 MLP training step.

    python -m benchmarks.bench_jit [--quick]

For each backend this environment has: the median per-call time of the
seeded function and of the same function compiled by the backend's own
entry point (``torch.compile``, ``torch_xla.compile``, torchax's
``interop.jax_jit``), timed interleaved in one process; and the number of
compilations the compiler reports for 50 calls with 50 distinct seeds
(target 1 - the seed must be a runtime value). ``--quick`` uses tiny counts
and skips inductor, whose compilation alone takes tens of seconds here.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch

import devrng
from benchmarks.timing import interleaved

Row = dict[str, Any]
TARGET_RATIO = 1.10
SEEDS = 50
WIDTH = 64


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Dropout(0.1), torch.nn.Linear(WIDTH, WIDTH))


def _row(backend: str, ours: float, peer_name: str, peer: float, compiles: int, first: int,
         what: str = "step") -> Row:
    # A step that dynamo splits (at loss.backward()) is several graphs, each compiled
    # once: what must not grow with new seeds is the count after the first call.
    return {"case": f"seeded_jit per call, 64x64 MLP {what} [{backend}]", "devrng_us": ours,
            "peer": peer_name, "peer_us": peer, "ratio": ours / peer, "target": TARGET_RATIO,
            "note": "",  # the report's next row gives the compile counts
            "backend": backend, "compiles": compiles, "compiles_after_first_call": first,
            "target_compiles": 1}


def _skipped(backend: str, peer: str, why: str) -> Row:
    return {"case": f"seeded_jit per call, 64x64 MLP step [{backend}]", "devrng_us": None,
            "peer": peer, "peer_us": None, "ratio": None, "target": TARGET_RATIO,
            "note": f"skipped: {why}", "backend": backend, "compiles": None,
            "compiles_after_first_call": None, "target_compiles": 1}


def _measure(backend: str, make_fn: Callable[[], Callable[..., Any]],
             bare: Callable[[Callable[..., Any]], Callable[[], object]],
             seeded_call: Callable[[Any, int], object], peer_name: str, number: int,
             rounds: int, what: str = "step",
             extra: Callable[[Any], tuple[str, Callable[[], object]]] | None = None
             ) -> list[Row]:
    """Compile for 50 seeds (count), then time seeded vs bare calls interleaved.

    ``extra(step)`` may add a second, informational peer built from the seeded function.
    """
    step = devrng.seeded_jit(make_fn(), backend=backend)
    seeded_call(step, 1000)
    first = step.compile_count
    for seed in range(1, SEEDS):
        seeded_call(step, 1000 + seed)
    compiles = step.compile_count
    contenders: dict[str, Callable[[], object]] = {"peer": bare(make_fn())}
    counter = [0]

    def ours() -> object:
        counter[0] += 1
        return seeded_call(step, counter[0])

    contenders["ours"] = ours
    extra_name = None
    if extra is not None:
        extra_name, contenders["extra"] = extra(step)
    m = interleaved(contenders, number=number, rounds=rounds)
    rows = [_row(backend, m["ours"], peer_name, m["peer"], compiles, first, what)]
    if extra_name is not None:
        rows.append(_row(backend, m["ours"], extra_name, m["extra"], compiles, first, what))
        rows[1]["target"] = None
        rows[1]["note"] = ("informational: the program seeded_jit runs, called on ready JAX "
                           "arrays; the gap is torchax's tensor conversion (which jax_jit pays "
                           "too) and seeded_jit's own work")
    return rows


def bench_inductor(number: int, rounds: int) -> list[Row]:
    model = _model()
    x, y = torch.randn(WIDTH, WIDTH), torch.randn(WIDTH, WIDTH)

    def make() -> Callable[..., Any]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad)
                    p.grad = None
            return loss.detach()
        return step

    def bare(fn: Callable[..., Any]) -> Callable[[], object]:
        compiled = torch.compile(fn)
        return lambda: compiled(x, y)

    # One intra-op thread: on a shared 2-core machine, OpenMP threads waiting on each
    # other make per-call times swing by tens of percent between rounds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure("inductor", make, bare, lambda s, seed: s(x, y, seed=seed),
                        "torch.compile(step)", number, rounds)
    finally:
        torch.set_num_threads(threads)


def bench_torch_xla(number: int, rounds: int) -> list[Row]:
    import torch_xla

    device = torch_xla.device()
    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(WIDTH, WIDTH).to(device), torch.randn(WIDTH, WIDTH).to(device)
    torch_xla.sync()

    def make() -> Callable[..., Any]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    def bare(fn: Callable[..., Any]) -> Callable[[], object]:
        compiled = torch_xla.compile(fn)
        return lambda: compiled(x, y)

    return _measure("torch_xla", make, bare, lambda s, seed: s(x, y, seed=seed),
                    "torch_xla.compile(step)", number, rounds)


def bench_openxla(number: int, rounds: int) -> list[Row]:
    import torch_xla

    device = torch_xla.device()
    model = _model().to(device)
    x, y = torch.randn(WIDTH, WIDTH).to(device), torch.randn(WIDTH, WIDTH).to(device)
    torch_xla.sync()

    def make() -> Callable[..., Any]:
        # openxla cannot compile loss.backward() inside the function (torch_xla 2.9):
        # the compiled part of an openxla training step is forward + loss.
        def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(model(x), y)
        return forward

    def bare(fn: Callable[..., Any]) -> Callable[[], object]:
        compiled = torch.compile(fn, backend="openxla")
        return lambda: compiled(x, y)

    return _measure("openxla", make, bare, lambda s, seed: s(x, y, seed=seed),
                    'torch.compile(forward, backend="openxla")', number, rounds,
                    what="forward + loss")


def bench_torchax(number: int, rounds: int) -> list[Row]:
    import jax
    import numpy as np
    import torchax
    from torchax import interop

    model = _model()
    env = torchax.default_env()
    with env:
        params = {k: v.detach().to("jax") for k, v in model.state_dict().items()}
        x, y = torch.randn(WIDTH, WIDTH).to("jax"), torch.randn(WIDTH, WIDTH).to("jax")

    def make() -> Callable[..., Any]:
        def loss_fn(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(torch.func.functional_call(model, p, (x,)), y)

        def step(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
            grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
            return loss, {k: p[k] - 0.01 * grads[k] for k in p}
        return step

    def bare(fn: Callable[..., Any]) -> Callable[[], object]:
        compiled = interop.jax_jit(fn)
        return lambda: jax.block_until_ready(interop.jax_view(compiled(params, x, y)))

    def seeded(s: Any, seed: int) -> object:
        return jax.block_until_ready(interop.jax_view(s(params, x, y, seed=seed)))

    def same_program(step: Any) -> tuple[str, Callable[[], object]]:
        # The very program seeded_jit runs, called with a fixed key on JAX arrays.
        jitted = step._runner._jitted
        key = np.array([0, 1], dtype=np.uint32)
        jp, jx, jy = interop.jax_view((params, x, y))
        return ("the same jitted program, key passed by hand",
                lambda: jax.block_until_ready(jitted(key, jp, jx, jy)))

    # The bare jax_jit peer rotates torchax's key inside its trace and leaves a tracer as the
    # environment's key: put the key back, or the process's next draw (or snapshot) fails.
    key = env.param.prng
    try:
        return _measure("torchax", make, bare, seeded, "torchax.interop.jax_jit(step)",
                        number, rounds, extra=same_program)
    finally:
        env.param.prng = key


def run(quick: bool = False) -> list[Row]:
    """One row per backend: per-call times, their ratio and the compile count for 50 seeds."""
    number, rounds = (5, 3) if quick else (100, 11)
    rows: list[Row] = []
    has_xla = importlib.util.find_spec("torch_xla") is not None
    if has_xla:
        # The XLA runtime must start before the process's first backward pass (torch
        # 2.9's autograd engine sizes its device queues then), and inductor runs one.
        import torch_xla

        torch_xla.device()
    if quick:
        rows.append(_skipped("inductor", "torch.compile(step)",
                             "quick mode (inductor compiles for tens of seconds here)"))
    else:
        rows += bench_inductor(number, rounds)
    if not has_xla:
        why = "torch_xla is not installed here (xla env)"
        rows.append(_skipped("torch_xla", "torch_xla.compile(step)", why))
        rows.append(_skipped("openxla", 'torch.compile(forward, backend="openxla")', why))
    else:
        rows += bench_torch_xla(number, rounds)
        rows += bench_openxla(number, rounds)
    if importlib.util.find_spec("torchax") is None:
        rows.append(_skipped("torchax", "torchax.interop.jax_jit(step)",
                             "torchax is not installed here (xla env)"))
    else:
        rows += bench_torchax(number, rounds)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="seeded_jit per-call overhead and compile counts")
    parser.add_argument("--quick", action="store_true", help="tiny iteration counts, no inductor")
    args = parser.parse_args(argv)
    from benchmarks.report import format_table

    rows = run(quick=args.quick)
    print(format_table(rows))
    seen = set()
    for r in rows:
        if r["compiles"] is not None and r["backend"] not in seen:
            seen.add(r["backend"])
            print(f"{r['backend']}: {r['compiles']} compilation(s) for {SEEDS} distinct seeds "
                  f"({r['compiles_after_first_call']} after the first)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
