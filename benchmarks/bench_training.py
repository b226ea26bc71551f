"""Checkpoint costs: TrainingRNG's state next to a small model checkpoint, what a resumed
run pays devrng (the state round trip with a tracked loader, the per-epoch seed for
workers kept across epochs) next to one training step, the digest of a saved state next
to the round trip it is part of, and activation checkpointing on
XLA through patch_torch() next to torch_xla's own checkpoint.

    python -m benchmarks.bench_training [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import sys
from typing import Any

import torch

import devrng
from benchmarks.timing import interleaved
from devrng._generators.saved import decode, encode

Row = dict[str, Any]


def _mlp(width: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Dropout(0.1), torch.nn.Linear(width, width))


def bench_state(number: int, rounds: int) -> list[Row]:
    """TrainingRNG.state_dict() + torch.save + torch.load + load_state_dict, against the same
    round trip of a 64x64 MLP's model and optimizer state (what a checkpoint holds anyway)."""
    rng = devrng.TrainingRNG(seed=0)
    rng.dataloader_kwargs()
    rng.track("step", devrng.seeded_jit(lambda x: x, backend="eager"))
    model = _mlp()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()

    def save(obj: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    def ours() -> None:
        data = save(rng.state_dict())
        rng.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))

    def peer() -> None:
        data = save({"model": model.state_dict(), "optimizer": opt.state_dict()})
        loaded = torch.load(io.BytesIO(data), weights_only=True)
        model.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["optimizer"])

    m = interleaved({"ours": ours, "peer": peer}, number=number, rounds=rounds)
    ours_bytes = len(save(rng.state_dict()))
    peer_bytes = len(save({"model": model.state_dict(), "optimizer": opt.state_dict()}))
    return [{
        "case": "TrainingRNG state_dict + save + load + load_state_dict", "devrng_us": m["ours"],
        "peer": "the same for a 64x64 MLP's model + Adam state", "peer_us": m["peer"],
        "ratio": m["ours"] / m["peer"], "target": None,
        "note": f"informational: {ours_bytes / 1024:.1f} KiB vs {peer_bytes / 1024:.1f} KiB "
                f"({ours_bytes / peer_bytes:.2f}x the size)",
        "bytes": ours_bytes, "peer_bytes": peer_bytes,
    }]


def bench_resume_overhead(number: int, rounds: int) -> list[Row]:
    """What a resume costs next to one training step of a 64x64 MLP (batch 32, dropout,
    SGD): the TrainingRNG state round trip in memory with a tracked DataLoader (its
    description and the comparison that decides whether to warn), and the per-epoch seed
    that devrng's Lightning callback gives workers kept across epochs (one draw from the
    loader's generator and one write to the workers' shared memory)."""
    rng = devrng.TrainingRNG(seed=0)
    kwargs = rng.dataloader_kwargs()
    rng.track("loader", torch.utils.data.DataLoader(range(64), batch_size=32, shuffle=True,
                                                    **kwargs))
    rng.track("step", devrng.seeded_jit(lambda x: x, backend="eager"))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    state = rng.state_dict()
    size = len(next(iter(state.values())))
    # The loader's record alone: the same state with an empty record table.
    plain = decode(next(iter(state.values())), "the benchmark's state")
    record = size - len(encode({**plain, "loaders": {}}))
    seeding, generator = kwargs["worker_init_fn"], kwargs["generator"]

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def round_trip() -> None:
        rng.load_state_dict(rng.state_dict())

    def epoch_seed() -> None:
        base = torch.empty((), dtype=torch.int64).random_(generator=generator)
        seeding.set_epoch_seed(int(base.item()))

    # One intra-op thread: on a busy 2-core machine torch's thread pool makes this tiny step
    # ten times slower, which would flatter the ratios; the fastest step is the strict peer.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = interleaved({"state": round_trip, "epoch": epoch_seed, "step": step},
                        number=number, rounds=rounds)
    finally:
        torch.set_num_threads(threads)
    peer = "one training step of a 64x64 MLP (batch 32, dropout, SGD; 1 thread)"
    return [
        {"case": "resume: TrainingRNG state_dict + load_state_dict, a tracked DataLoader",
         "devrng_us": m["state"], "peer": peer, "peer_us": m["step"],
         "ratio": m["state"] / m["step"], "target": None,
         "note": f"informational: once per resume (and per checkpoint for state_dict); "
                 f"{size} bytes of state, {record} of them the loader's record (the "
                 "rest: generator states, 5 KB each)"},
        {"case": "resume: per-epoch seed for workers kept across epochs (Lightning callback)",
         "devrng_us": m["epoch"], "peer": peer, "peer_us": m["step"],
         "ratio": m["epoch"] / m["step"], "target": None,
         "note": "informational: once per epoch per loader with persistent_workers=True"},
    ]


def _lenet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(256, 120), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(120, 10))


def _mnist_cnn() -> torch.nn.Module:
    """Two 3x3 convolutions (32 and 64 channels), a 2x2 max pool, a 9216-128-10 head with
    dropout: the small CNN most MNIST tutorials train."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Dropout(0.25), torch.nn.Flatten(),
        torch.nn.Linear(9216, 128), torch.nn.ReLU(), torch.nn.Dropout(0.5),
        torch.nn.Linear(128, 10))


#: The record's own work per optimizer step, at most (half its cost before 0.5).
FLIGHT_BUDGET_US = 130.0
_CNN = "the MNIST tutorials' CNN"


def bench_flight(number: int, rounds: int) -> list[Row]:
    """What the flight record costs on the CPU, record on against off in one process,
    interleaved, one thread, timed by the thread's CPU time (the machine's other work does
    not lengthen it; what that work does to the caches is still paid). Both contenders
    train the same model on the same data, each with its own optimizer and loader.

    - Its own work per optimizer step: the step does nothing else (its next batch, a
      backward pass through one bias, an optimizer step that updates none of the MNIST
      tutorials' CNN's parameters, its loss), against the budget, and added to the CNN's
      training step without the record (target: 1%).
    - One training step (forward, backward, SGD; batch 64 of MNIST-sized images) of the
      MNIST tutorials' CNN, a 784-256-10 MLP and a LeNet-5, on against off.

    Each with its batches from a tracked, shuffled DataLoader without workers (the record
    digests each batch and its indices too) and, for the record's own work and the CNN,
    without one (a batch the loop holds: the record reads generators, parameters, loss)."""
    import statistics
    import tempfile
    import time

    from benchmarks.timing import samples

    steps: list[Row] = []
    own: list[Row] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    directory = tempfile.mkdtemp(prefix="devrng-bench-flight-")
    path = os.path.join(directory, "devrng-flight.rank0.jsonl")

    def measure(make: Any, count: int, repeats: int) -> tuple[float, float, float, float]:
        """(on, off, on - off: medians in µs; bytes a step on disk) of ``make(flight)``."""
        found = samples({"on": make(True), "off": make(False)}, number=count, rounds=repeats,
                        clock=time.thread_time)
        with open(path, "rb") as fh:
            lines = [line for line in fh.read().splitlines() if line.startswith(b'{"s":')]
        os.remove(path)
        on, off = found["on"], found["off"]
        return (statistics.median(on), statistics.median(off),
                statistics.median(a - b for a, b in zip(on, off, strict=True)),
                sum(map(len, lines)) / max(1, len(lines)) + 1)

    try:
        cnn: dict[bool, float] = {}
        for name, make, loader, count, repeats in (
                (_CNN, _mnist_cnn, True, max(1, number // 25), 5 * rounds),
                (_CNN, _mnist_cnn, False, max(1, number // 25), 5 * rounds),
                ("a 784-256-10 MLP", _mlp784, True, number, rounds),
                ("a LeNet-5", _lenet, True, max(1, number // 4), rounds)):
            shared = (make(), _data(loader))
            on, off, extra, size = measure(
                lambda flight, sh=shared, lo=loader: _training_step(directory, flight, *sh, lo),
                count, repeats)
            if name == _CNN:
                cnn[loader] = off
            steps.append({
                "case": f"flight record: one training step of {name} (batch 64, CPU), "
                        f"{_mode(loader)}",
                "devrng_us": on, "peer": "the same step without the record", "peer_us": off,
                "ratio": on / off, "target": None,
                "note": f"informational: {extra:+.0f} µs a step ({extra / off:+.2%}); the "
                        f"median of {repeats} rounds; {size:.0f} bytes a step on disk",
                "bytes": size})
        for loader in (True, False):
            shared = (_mnist_cnn(), _data(loader))
            _, _, work, size = measure(
                lambda flight, sh=shared, lo=loader: _bare_step(directory, flight, *sh, lo),
                max(1, number // 2), 9 * rounds)
            own.append({
                "case": f"flight record: its own work per optimizer step, {_mode(loader)} (CPU)",
                "us": work, "target_us": FLIGHT_BUDGET_US, "devrng_us": work, "peer": None,
                "peer_us": None, "ratio": None, "target": None, "bytes": size,
                "note": f"{size:.0f} bytes a step on disk"})
            # The CNN's step varies by more than the record's work between rounds (by a few
            # ms under load): the share is the record's own work over the step without it.
            own.append({
                "case": f"flight record's own work + {_CNN}'s step, {_mode(loader)}",
                "devrng_us": cnn[loader] + work, "peer": "the same step without the record",
                "peer_us": cnn[loader], "ratio": (cnn[loader] + work) / cnn[loader],
                "target": 1.01, "note": f"the record's own work is {work / cnn[loader]:.2%} "
                                        f"of the step"})
    finally:
        torch.set_num_threads(threads)
    return own + steps


def _mode(loader: bool) -> str:
    return "a tracked DataLoader" if loader else "no tracked DataLoader"


def _data(loader: bool) -> Any:
    """64 MNIST-sized images a step: a dataset of 6,400 to load from, or one batch."""
    data = torch.utils.data.TensorDataset(torch.randn(6400, 1, 28, 28),
                                          torch.randint(0, 10, (6400,)))
    return data if loader else data[:64]


def _mlp784() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                               torch.nn.Dropout(0.1), torch.nn.Linear(256, 10))


class _NoUpdate(torch.optim.Optimizer):
    """An optimizer whose step changes nothing: its hooks (the record's) still run."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def _source(rng: Any, data: Any, loader: bool) -> Any:
    """The next batch: from a shuffled DataLoader over ``data`` that ``rng`` tracks, or
    (``loader`` False) ``data`` itself each time."""
    if not loader:
        return lambda: data
    tracked = rng.track("loader", torch.utils.data.DataLoader(
        data, batch_size=64, shuffle=True, **rng.dataloader_kwargs()))
    batches = iter(tracked)

    def take() -> Any:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(tracked)
            return next(batches)

    return take


def _training_step(directory: str, flight: bool, model: torch.nn.Module, data: Any,
                   loader: bool) -> Any:
    rng = devrng.TrainingRNG(seed=0, flight_record=directory if flight else None)
    take = _source(rng, data, loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rng.flight is not None:
        rng.flight.watch_optimizer(opt)  # the other contender's steps are not ours

    def step() -> None:
        x, y = take()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rng.flight is not None:
            rng.flight.loss(loss)

    return step


def _bare_step(directory: str, flight: bool, model: torch.nn.Module, data: Any,
               loader: bool) -> Any:
    rng = devrng.TrainingRNG(seed=0, flight_record=directory if flight else None)
    take = _source(rng, data, loader)
    last = list(model.parameters())[-1]
    opt = _NoUpdate(model.parameters())
    if rng.flight is not None:
        rng.flight.watch_optimizer(opt)

    def step() -> None:
        take()
        loss = last.sum()
        loss.backward()
        opt.step()
        if rng.flight is not None:
            rng.flight.loss(loss)

    return step


def bench_digest(number: int, rounds: int) -> list[Row]:
    """The digest every saved state carries, on a TrainingRNG state with a tracked DataLoader
    (about 23 KB): made when the state is saved, verified when it is loaded, each next to the
    in-memory state round trip (``state_dict`` + ``load_state_dict``) it is part of."""
    from devrng._generators.saved import _verify, seal  # the digest alone, not public

    rng = devrng.TrainingRNG(seed=0)
    rng.track("loader", torch.utils.data.DataLoader(range(64), batch_size=32, shuffle=True,
                                                    **rng.dataloader_kwargs()))
    rng.track("step", devrng.seeded_jit(lambda x: x, backend="eager"))
    (entry,) = rng.state_dict().values()
    plain = torch.load(io.BytesIO(entry), weights_only=True)
    content = {k: v for k, v in plain.items() if k not in ("devrng_version", "digest")}

    def verify() -> None:
        _verify(plain, plain["version"], "bench")

    def round_trip() -> None:
        rng.load_state_dict(rng.state_dict())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as bench_resume_overhead: the round trip is its peer here
    try:
        m = interleaved({"seal": lambda: seal(content), "verify": verify, "trip": round_trip},
                        number=number, rounds=rounds)
    finally:
        torch.set_num_threads(threads)
    peer = "the state round trip it is part of (state_dict + load_state_dict, 1 thread)"
    note = (f"informational: SHA-256 over the exact bytes of a {len(entry)}-byte TrainingRNG "
            "state (once per save; a load verifies this and the snapshot inside it)")
    return [
        {"case": "digest: seal a TrainingRNG state when it is saved", "devrng_us": m["seal"],
         "peer": peer, "peer_us": m["trip"], "ratio": m["seal"] / m["trip"], "target": None,
         "note": note},
        {"case": "digest: verify a TrainingRNG state before it is loaded",
         "devrng_us": m["verify"], "peer": peer, "peer_us": m["trip"],
         "ratio": m["verify"] / m["trip"], "target": None, "note": note},
    ]


def bench_checkpoint_xla(number: int, rounds: int) -> list[Row]:
    """A training step whose two blocks are activation-checkpointed (dropout inside), on XLA:
    torch.utils.checkpoint through devrng.patch_torch() vs torch_xla.utils.checkpoint."""
    case = "checkpointed training step on XLA: torch.utils.checkpoint + patch_torch()"
    peer_name = "torch_xla.utils.checkpoint.checkpoint"
    if importlib.util.find_spec("torch_xla") is None:
        return [{"case": case, "devrng_us": None, "peer": peer_name, "peer_us": None,
                 "ratio": None, "target": 1.05,
                 "note": "skipped: torch_xla is not installed here (xla env)"}]
    import torch.utils.checkpoint as torch_ckpt
    import torch_xla
    import torch_xla.utils.checkpoint as xla_ckpt

    device = torch_xla.device()
    blocks = [_mlp().to(device) for _ in range(2)]
    params = [p for b in blocks for p in b.parameters()]
    x = torch.randn(32, 64).to(device).requires_grad_()  # reentrant checkpoints need one
    torch_xla.sync()
    devrng.patch_torch()

    def step(checkpoint: Any) -> None:
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=True)  # the only mode torch_xla supports
        h.sum().backward()
        for p in params:
            p.grad = None
        torch_xla.sync()

    def no_rng(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return torch_ckpt.checkpoint(fn, *args, preserve_rng_state=False, **kwargs)

    m = interleaved({"ours": lambda: step(torch_ckpt.checkpoint),
                     "peer": lambda: step(xla_ckpt.checkpoint),
                     "floor": lambda: step(no_rng)}, number=number, rounds=rounds)
    devrng.unpatch_torch()
    return [
        {"case": case, "devrng_us": m["ours"], "peer": peer_name, "peer_us": m["peer"],
         "ratio": m["ours"] / m["peer"], "target": 1.05, "note": ""},
        {"case": case, "devrng_us": m["ours"], "peer": "the same without RNG state "
         "(preserve_rng_state=False: wrong masks, devrng not involved)", "peer_us": m["floor"],
         "ratio": m["ours"] / m["floor"], "target": None,
         "note": "informational: what saving and restoring the XLA and CPU states costs"},
    ]


def run(quick: bool = False) -> list[Row]:
    if importlib.util.find_spec("torch_xla") is not None:
        # torch 2.9 + torch_xla 2.9: a CPU backward pass before the XLA runtime starts
        # breaks every later XLA backward; start XLA first, as an XLA program does.
        import torch_xla

        torch_xla.device()
    number, rounds = (5, 2) if quick else (200, 9)
    return (bench_state(number, rounds) + bench_resume_overhead(number, rounds)
            + bench_flight(max(1, number // 4), rounds) + bench_digest(number, rounds)
            + bench_checkpoint_xla(max(1, number // 4), rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from benchmarks.report import format_table

    print(format_table(run(quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
