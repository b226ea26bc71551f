"""devrng.portable on DTensors over real gloo process groups: each rank draws exactly its
slice of the full draw, on 1-D and 2-D CPU meshes, where torch's own DTensor RNG does not
work (pytorch/pytorch#138329); and a run resumed on another world size continues exactly.

Two jobs are launched once per module: 2 processes (1-D mesh), then 4 (a 1-D mesh and a
2x2 mesh). Every process runs all cases in turn and writes what it saw to a JSON file;
the full tensors are gathered with ``full_tensor()`` and compared here with the same ops
on plain tensors in this process. The 2-process job also saves a TrainingRNG checkpoint
in the middle of its run; the 4-process job resumes from it.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.multiprocessing.spawn import ProcessException, ProcessExitedException

import devrng

# Every test starts gloo process groups in processes of its own: slow.
pytestmark = [pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built"),
              pytest.mark.slow]
SEED = 31
RUN_SEED = 2024
SHAPE = (6, 5)  # uneven on 4 ranks: one of the shards along dim 0 is smaller, one is empty
FEATURES = (4, 6, 3, 2)  # (N, C, H, W) for channel dropout


# -- the ops every case runs, on DTensors in the jobs and on plain tensors here ------------------
def _ops(make: Callable[[tuple[int, ...]], torch.Tensor]) -> list[torch.Tensor]:
    """The covered ops on tensors from ``make(shape)``, in one portable stream."""
    out = []
    with devrng.portable(SEED):
        out.append(make(SHAPE).uniform_(-1.0, 1.0))
        out.append(make(SHAPE).normal_(0.0, 0.02))
        out.append(torch.nn.init.kaiming_uniform_(make(SHAPE)))
        out.append(make(SHAPE).bernoulli_(0.3))
        out.append(F.dropout(make(SHAPE).fill_(1.0), 0.4))
        out.append(torch.rand_like(make(SHAPE)))
        out.append(torch.randn_like(make(SHAPE)))
        out.append(torch.randint_like(make(SHAPE), 0, 100))
        out.append(F.dropout2d(make(FEATURES).fill_(1.0), 0.5))
        out.append(make(SHAPE).exponential_())
    return out


def _steps(make: Callable[[tuple[int, ...]], torch.Tensor], stream: Any, steps: int
           ) -> list[list[float]]:
    """Training-like steps: an init and a dropout per step, from ``stream``."""
    out = []
    for _ in range(steps):
        with stream:
            w = torch.nn.init.xavier_uniform_(make(SHAPE))
            y = F.dropout(make(SHAPE).fill_(1.0), 0.5)
        out.append([_full(w), _full(y)])
    return out


def _full(t: torch.Tensor) -> list[Any]:
    return (t.full_tensor() if type(t).__name__ == "DTensor" else t).tolist()


# -- what every process runs -----------------------------------------------------------------
def _layouts(world: int) -> list[tuple[str, tuple[int, ...], list[Any]]]:
    from torch.distributed.tensor import Replicate, Shard

    layouts = [(f"1d{world}-shard0", (world,), [Shard(0)]),
               (f"1d{world}-shard1", (world,), [Shard(1)]),
               (f"1d{world}-replicate", (world,), [Replicate()])]
    if world == 4:
        layouts += [("2x2-shard0-shard1", (2, 2), [Shard(0), Shard(1)]),
                    ("2x2-shard1-replicate", (2, 2), [Shard(1), Replicate()]),
                    ("2x2-shard0-shard0", (2, 2), [Shard(0), Shard(0)]),
                    ("2x2-replicate-shard2", (2, 2), [Replicate(), Shard(2)])]
    return layouts


def _checks(rank: int, world: int, out_dir: Path) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    out: dict[str, Any] = {"rank": rank, "cases": {}, "warnings": []}
    meshes: dict[tuple[int, ...], Any] = {}
    for name, mesh_shape, placements in _layouts(world):
        if mesh_shape not in meshes:
            meshes[mesh_shape] = init_device_mesh("cpu", mesh_shape)
        mesh = meshes[mesh_shape]

        def make(shape: tuple[int, ...], mesh: Any = mesh, placements: list[Any] = placements
                 ) -> torch.Tensor:
            # Shard(2) of the channel-dropout input splits dim 0 of the 2-D tensors.
            fitted = [type(p)(0) if getattr(p, "dim", 0) >= len(shape) else p
                      for p in placements]
            return distribute_tensor(torch.zeros(shape), mesh, fitted)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = _ops(make)
        out["warnings"] += [f"{name}: {w.category.__name__}: {w.message}" for w in caught]
        out["cases"][name] = [_full(t) for t in results]
    out.update(_resume(rank, world, meshes, out_dir))
    return out


def _resume(rank: int, world: int, meshes: dict[tuple[int, ...], Any], out_dir: Path
            ) -> dict[str, Any]:
    """world 2: run 2 steps, checkpoint, run 2 more; world 4: resume from that checkpoint."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = meshes[(world,)]

    def make(shape: tuple[int, ...]) -> torch.Tensor:
        return distribute_tensor(torch.zeros(shape), mesh, [Shard(0)])

    if world == 2:
        rng = devrng.TrainingRNG(seed=RUN_SEED)
        stream = rng.portable()
        before = _steps(make, stream, 2)
        torch.save(rng.state_dict(), out_dir / f"ckpt-rank{rank}.pt")
        return {"before": before, "after": _steps(make, stream, 2)}
    rng = devrng.TrainingRNG(seed=1)  # another run's seed: the checkpoint must win
    stream = rng.portable()
    saved = torch.load(out_dir / f"ckpt-rank{rank % 2}.pt", weights_only=True)
    with warnings.catch_warnings():
        # Saved by rank r % 2 of 2: TrainingRNG warns that it reseeds the global generators.
        warnings.simplefilter("ignore")
        rng.load_state_dict(saved, strict=False)
    return {"resumed": _steps(make, stream, 2)}


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    log = os.open(Path(out_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 2)
    os.close(log)
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        out = _checks(rank, world, Path(out_dir))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    # Leave without the interpreter's teardown: the gloo exit abort (pytorch/pytorch#190489)
    # can hit a passing run there, and the results are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class JobFailed(RuntimeError):
    def __init__(self, message: str, *, by_signal: bool) -> None:
        super().__init__(message)
        self.by_signal = by_signal


def _launch(out_dir: Path, world: int, attempt: int = 0) -> list[dict[str, Any]]:
    store = out_dir / f"store-{world}-{attempt}"  # a FileStore file serves one job only
    try:
        mp.spawn(_worker, args=(world, str(store), str(out_dir)), nprocs=world, join=True)
    except ProcessException as err:
        logs = "\n".join(
            f"--- rank {r}:\n" + "\n".join(_read(out_dir / f"rank{r}.log").splitlines()[-30:])
            for r in range(world))
        raise JobFailed(f"the {world}-process gloo job failed: {err}\n{logs}",
                        by_signal=isinstance(err, ProcessExitedException)
                        and bool(err.signal_name)) from err
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else "(none)"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """The 2-process job, then the 4-process job that resumes its checkpoint."""
    out_dir = tmp_path_factory.mktemp("portable-dtensor")
    results = {}
    for world in (2, 4):
        try:
            results[world] = _launch(out_dir, world)
        except JobFailed as err:
            # A rank killed by a signal from native code after its work (the gloo exit
            # abort) gets one more launch, reported; a Python error fails at once.
            if not err.by_signal:
                raise
            warnings.warn(f"retrying once: {err}", stacklevel=1)
            results[world] = _launch(out_dir, world, attempt=1)
    return results


def _reference() -> list[list[Any]]:
    return [t.tolist() for t in _ops(lambda shape: torch.zeros(shape))]


# -- the tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_holds_its_slice_of_the_full_draw(jobs: dict[int, list[dict[str, Any]]],
                                                     world: int) -> None:
    want = _reference()
    for result in jobs[world]:
        assert set(result["cases"]) == {name for name, _, _ in _layouts(world)}
        for name, got in result["cases"].items():
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g == w, f"rank {result['rank']}, {name}, op {i}"


@pytest.mark.parametrize("world", [2, 4])
def test_no_warning_from_torch_or_devrng(jobs: dict[int, list[dict[str, Any]]], world: int
                                        ) -> None:
    # torch's own DTensor random ops warn on CPU meshes (#138329); portable never calls them.
    for result in jobs[world]:
        assert result["warnings"] == []


def test_a_run_resumed_on_another_world_size_continues_exactly(
        jobs: dict[int, list[dict[str, Any]]]) -> None:
    uninterrupted = jobs[2][0]["after"]
    for result in jobs[2]:
        assert result["after"] == uninterrupted and result["before"] == jobs[2][0]["before"]
    for result in jobs[4]:
        assert result["resumed"] == uninterrupted
    stream = devrng.TrainingRNG(seed=RUN_SEED).portable()
    single = _steps(lambda shape: torch.zeros(shape), stream, 4)
    assert single[:2] == jobs[2][0]["before"] and single[2:] == uninterrupted


def test_partial_placements_are_refused_with_a_sentence() -> None:
    from tests._internals import check_placements

    class Partial:
        def __repr__(self) -> str:
            return "Partial(sum)"

    class Fake:
        placements = (Partial(),)

    with pytest.raises(devrng.DevRNGError, match=r"Shard and Replicate; this one has "
                                                 r"Partial\(sum\)"):
        check_placements(Fake())  # type: ignore[arg-type]


def test_shard_counters_index_the_full_tensor() -> None:
    from tests._internals import shard_counters

    full = torch.arange(6 * 5).reshape(6, 5)
    got = shard_counters((6, 5), (2, 3), (3, 1), torch.device("cpu"))
    assert torch.equal(got, full[3:5, 1:4])
