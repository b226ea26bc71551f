"""devrng's share of a torch.distributed.checkpoint (DCP) save and load, at 2, 4 and 8 ranks.

    python -m benchmarks.bench_dcp [--quick] [--worlds 2 4 8] [--json out.json]

Each world size is one ``torchrun`` job of CPU processes over gloo. Every rank builds a
small FSDP2 model (a 4-layer 256-wide MLP with dropout, ``fully_shard``) with AdamW
state, and a ``devrng.TrainingRNG`` tracking a DataLoader generator and the run's
portable stream, as a training program would. It then times, interleaved round after
round (a barrier before and after each call; the slowest rank's median):

- ``dcp.save`` of ``{"model", "optim"}`` and of the same with ``"rng": rng``;
- ``dcp.load`` of both;
- ``dcp.load({"rng": rng})`` alone: what devrng's part costs one rank to load, which
  must not grow with the number of ranks;

and the bytes: each rank's devrng entry, and the checkpoint directory with and without
it. Rows come out as ``benchmarks.run`` rows (informational: no target), to be added
to ``benchmarks/results`` and rendered with ``python -m benchmarks.report``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def worker(out: Path, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    import devrng

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = devrng.TrainingRNG(seed=1234)
    loader_kwargs = rng.dataloader_kwargs()
    rng.portable()
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU(), nn.Dropout(0.1)]
    model = nn.Sequential(*layers)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    optim.step()  # Adam's moments exist
    torch.rand(3, generator=loader_kwargs["generator"])
    model_sd, optim_sd = get_state_dict(model, optim)
    tmp = Path(out, "ckpt")
    plain, with_rng, tiny = tmp / "plain", tmp / "with-rng", tmp / "tiny"
    own = rng.state_dict()  # this rank's entry, to load without DCP
    marker = {"x": torch.zeros(1)}
    dcp.save(marker, checkpoint_id=str(tiny))

    def timed(fn: Callable[[], Any]) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    calls = {
        "save": lambda: dcp.save({"model": model_sd, "optim": optim_sd},
                                 checkpoint_id=str(plain)),
        "save+rng": lambda: dcp.save({"model": model_sd, "optim": optim_sd, "rng": rng},
                                     checkpoint_id=str(with_rng)),
        "load": lambda: dcp.load({"model": model_sd, "optim": optim_sd},
                                 checkpoint_id=str(plain)),
        "load+rng": lambda: dcp.load({"model": model_sd, "optim": optim_sd, "rng": rng},
                                     checkpoint_id=str(with_rng)),
        "load rng": lambda: dcp.load({"rng": rng}, checkpoint_id=str(with_rng)),
        # DCP's own cost of a load call (metadata, planning, its collectives) ...
        "load tiny": lambda: dcp.load(marker, checkpoint_id=str(tiny)),
        # ... and devrng's own: the ranks' agreement and the restore, without DCP.
        "rng only": lambda: rng.load_state_dict(own),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for name, call in calls.items():
            times[name].append(timed(call))
    medians = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    (entry,) = rng.state_dict().values()
    result = {"medians": medians, "entry_bytes": len(entry)}
    if rank == 0:
        result["bytes"] = {"plain": _size(plain), "with-rng": _size(with_rng)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    del world


def measure(world: int, rounds: int) -> dict[str, Any]:
    """One job of ``world`` ranks: the slowest rank's medians, entry sizes, directory sizes."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("RANK", None)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={world}", "-m", "benchmarks.bench_dcp",
                        "--worker", tmp, "--rounds", str(rounds)],
                       check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    medians = {name: max(r["medians"][name] for r in ranks) for name in ranks[0]["medians"]}
    return {"world": world, "medians": medians,
            "entry_bytes": max(r["entry_bytes"] for r in ranks), **ranks[0]["bytes"]}


def rows(results: list[dict[str, Any]]) -> list[Row]:
    out: list[Row] = []
    for res in results:
        m, w = res["medians"], res["world"]
        share = (res["with-rng"] - res["plain"]) / res["with-rng"]
        size = (f"devrng's entries: {res['with-rng'] - res['plain']} of {res['with-rng']} "
                f"bytes ({share:.1%}; {res['entry_bytes']} bytes per rank)")
        for what, ours, peer in (("save", "save+rng", "save"), ("load", "load+rng", "load")):
            out.append({
                "case": f"dcp.{what} of a small FSDP2 model + AdamW with a TrainingRNG, "
                        f"{w} ranks",
                "devrng_us": m[ours] * 1e6, "peer": f"the same dcp.{what} without it",
                "peer_us": m[peer] * 1e6, "ratio": m[ours] / m[peer], "target": None,
                "note": "informational (goal: devrng's share at most 5%); " + size})
        out.append({
            "case": f"dcp.load of the TrainingRNG alone, per rank, {w} ranks",
            "devrng_us": m["load rng"] * 1e6,
            "peer": "dcp.load of a one-element tensor (DCP's own cost of a load)",
            "peer_us": m["load tiny"] * 1e6, "ratio": m["load rng"] / m["load tiny"],
            "target": None,
            "note": "informational: a rank reads its own entry, whatever the number of ranks; "
                    f"devrng's part alone (load_state_dict of the entry: the ranks' agreement "
                    f"and the restore) {m['rng only'] * 1e3:.2f} ms"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.rounds)
        return 0
    from benchmarks.report import format_table

    results = [measure(w, 2 if args.quick else args.rounds) for w in args.worlds]
    table = rows(results)
    print(format_table(table))
    for res in results:
        print(json.dumps(res))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
