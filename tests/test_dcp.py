"""devrng's state inside torch.distributed.checkpoint (DCP), on real gloo process groups.

Each launch is a fresh ``torchrun`` of tests/_dcp_job.py (2 or 4 processes on this
machine's CPU) running the same FSDP2 training program, which saves and loads with DCP
the way a user does: ``dcp.save({"model": ..., "optim": ..., "rng": rng, ...})``.
Launches are shared (module-scoped fixtures): one run saves, one resumes and then tries
every bad checkpoint, one loads on another number of ranks. The tests compare what each
rank recorded: a resume on the same number of ranks must equal the uninterrupted run
bitwise; anything else must raise or warn on every rank, naming the rank or the world
sizes, with no generator changed on any rank when it raises.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests._helpers import ROOT, run_env, run_torchrun

pytestmark = [
    pytest.mark.slow,  # torchrun jobs of 2 and 4 ranks, tens of seconds each
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built"),
    # Each launch costs tens of seconds on this machine's 2 cores: they run once, in the
    # environment of the newest torch (core); the older ones run the rest of the suite.
    pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13),
                       reason="the DCP launches run in the core environment (torch 2.13)"),
]
JOB = ROOT / "tests" / "_dcp_job.py"


def _launch(root: Path, world: int, phase: str, arg: str, *extra: str) -> list[dict[str, Any]]:
    env = {**run_env(), "OMP_NUM_THREADS": "1"}  # no RANK: torchrun gives each rank its own
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={world}", str(JOB), phase, str(root), arg, *extra]
    label = arg.replace("/", "_") + "".join(f"-tp{e}" for e in extra)
    results = [root / f"{phase}-{label}-{r}.json" for r in range(world)]
    proc = run_torchrun(cmd, cwd=root, env=env, timeout=600,
                        finished=lambda _: all(r.exists() for r in results))
    if proc.returncode != 0:
        errors = "\n".join(p.read_text() for p in sorted(root.glob(f"{phase}-{label}-*.err")))
        pytest.fail(f"{phase} on {world} ranks failed:\n{errors or proc.stderr[-6000:]}")
    return [json.loads((root / f"{phase}-{label}-{r}.json").read_text()) for r in range(world)]


class Launches:
    """Each launch once per module, whichever tests ask for it first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def __call__(self, world: int, phase: str, arg: str, *extra: str) -> list[dict[str, Any]]:
        if (world, phase, arg, *extra) not in self.done:
            self.done[world, phase, arg, *extra] = _launch(self.root, world, phase, arg, *extra)
        return self.done[world, phase, arg, *extra]

    def saved(self, world: int) -> list[dict[str, Any]]:
        """The uninterrupted run on ``world`` ranks, which saves checkpoint ``ckpt<world>``."""
        return self(world, "save", f"ckpt{world}")

    def loaded(self, world: int) -> list[dict[str, Any]]:
        """Fresh processes resuming ``ckpt<world>`` on ``world`` ranks, then bad checkpoints."""
        self.saved(world)
        return self(world, "load", f"ckpt{world}/ckpt")

    def resharded(self, change: str, tp: int | None = None) -> list[dict[str, Any]]:
        """``ckpt<a>`` loaded on ``b`` ranks, for ``change`` ``"a->b"`` (``tp``: the
        tensor-parallel size of the Megatron-style streams there; by default 2, or 1 on 1 rank)."""
        a, b = map(int, change.split("->"))
        self.saved(a)
        return self(b, "reshard", f"ckpt{a}/ckpt", *([str(tp)] if tp else []))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Launches:
    return Launches(tmp_path_factory.mktemp("dcp"))


# 4 processes on this machine's 2 cores: about a minute per launch, so in the slow run.
WORLDS = [2, 4]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kind", ["ckpt", "ckpt-async"])
def test_resume_is_bitwise_the_uninterrupted_run(jobs: Launches, world: int, kind: str) -> None:
    saved, loaded = jobs.saved(world), jobs.loaded(world)
    for rank in range(world):
        resumed = loaded[rank][f"ckpt{world}/{kind}"]
        assert resumed["after"] == saved[rank]["after"], f"rank {rank}"
        assert resumed["weights"] == saved[rank]["weights"], f"rank {rank}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kind", ["ckpt", "ckpt-async"])
def test_every_rank_verified_its_resume_with_its_flight_record(jobs: Launches, world: int,
                                                               kind: str) -> None:
    """Each rank keeps its own record file; loading through DCP finds the checkpoint in it and
    the resumed steps match what the uninterrupted run recorded after the save, on every rank."""
    loaded = jobs.loaded(world)
    assert [loaded[rank][f"ckpt{world}/{kind}"]["verified"] for rank in range(world)] \
        == [True] * world


@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_got_its_own_state_back(jobs: Launches, world: int) -> None:
    """The per-rank parts differ from rank to rank: a patchwork would have repeated one."""
    saved = jobs.saved(world)
    for key in ("per_rank", "noise"):
        per_rank = [saved[r]["after"][0][key] for r in range(world)]
        assert len({json.dumps(p) for p in per_rank}) == world, key


def _everyone(results: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    return [r["bad"][case] for r in results]


@pytest.mark.parametrize(("case", "match"), [
    ("corrupt", "rank 1 of 2 could not load .*could not be read"),
    ("newer", "rank 0 of 2 could not load .*version 99; this devrng reads"),
    ("other_seed", "different seeds"),
    ("missing_rank_planner", "holds the states of 1 rank.*this job has 2, so rank 1 has none"),
    ("none_planner", "no rank found its entry"),
    ("live_seed", "made with seed 1241 and the checkpoint's run used seed 1234"),
    ("tracked", "'extra', which are tracked here"),
    ("apply_fails", "rank 1 of 2 could not apply .*every rank put its own back.*simulated"),
    # DCP's own DefaultLoadPlanner(allow_partial_load=True) skips rank 1's missing entry and
    # leaves the template its state_dict() made in place (rank 0 would resume, rank 1 not).
    ("missing_rank_partial", r"no devrng entry for rank 1: dcp.load left in place the entry "
                             r"rank 1's state_dict\(\) made .*allow_partial_load=True.*no rank "
                             r"loaded any"),
    ("none_partial", r"no devrng entry under this key .* for any rank: dcp.load left in place"),
    # Rank 1 died while the directory was overwritten: rank 0's file is one step newer.
    ("mixed", r"entries come from different saves: rank 0's from save [0-9a-f]{16} and rank "
              r"1's from save [0-9a-f]{16}, so no rank loaded any.*a directory of its own"),
    # A TrainingRNG ("rng") and a portable stream ("shared") in one dcp.load: the stream
    # refuses after the TrainingRNG loaded, which is put back on every rank.
    ("pair", r"PortableRNG.load_state_dict: this stream has seed 78 and the checkpoint's has "
             r"seed 77.* The devrng values this dcp.load loaded before it \('rng'\) were put "
             r"back as well\."),
    ("flipped", "rank 1 of 2 could not load .*the entry 'devrng_rank_1' was altered or damaged "
                "after devrng .* wrote it"),
    ("swapped", "rank 0 of 2 could not load .*the entry 'devrng_rank_0' holds the state that "
                "rank 1 saved"),
])
def test_bad_checkpoint_raises_on_every_rank_and_changes_nothing(jobs: Launches, case: str,
                                                                  match: str) -> None:
    for rank, seen in enumerate(_everyone(jobs.loaded(2), case)):
        assert seen["devrng"], (rank, seen)
        assert re.search(match, seen["msg"], flags=re.S), (rank, seen["msg"])
        assert seen["unchanged"], f"rank {rank} changed a generator"


def test_entries_of_two_saves_are_named_by_their_identities(jobs: Launches) -> None:
    """The message names two different save identities, the same on both ranks."""
    seen = [re.findall(r"save ([0-9a-f]{16})", r["msg"]) for r in _everyone(jobs.loaded(2),
                                                                             "mixed")]
    assert len(set(seen[0])) == 2 and seen[0] == seen[1], seen


@pytest.mark.parametrize("case", ["missing_rank", "none"])
def test_missing_entry_with_dcps_planner_fails_inside_dcp_on_every_rank(jobs: Launches,
                                                                       case: str) -> None:
    """DCP plans the load before devrng sees anything: its own error, on every rank."""
    for rank, seen in enumerate(_everyone(jobs.loaded(2), case)):
        assert seen["error"] == "CheckpointException", (rank, seen)
        assert "Missing key in checkpoint state_dict: rng.devrng_rank_" in seen["msg"]
        assert seen["unchanged"]


@pytest.mark.parametrize("change", ["2->1", "4->2"])
def test_shrink_refuses_or_warns_naming_both_world_sizes(jobs: Launches, change: str) -> None:
    saved_world, world = change.split("->")
    for rank, seen in enumerate(jobs.resharded(change)):
        strict = seen["rng_strict"]
        assert strict["devrng"] and f"rank 0 of {saved_world}, and this is rank 0 of " \
            f"{world}" in strict["msg"], (rank, strict)
        lenient = seen["rng_lenient_planner"]
        assert lenient["error"] is None, lenient
        assert any(f"saved by {saved_world} ranks and this job has {world}" in w
                   for w in lenient["warnings"]), lenient


def test_grown_world_fails_in_dcp_by_default_and_speaks_with_devrngs_planner(jobs: Launches
                                                                             ) -> None:
    for rank, seen in enumerate(jobs.resharded("2->3")):
        assert seen["rng_strict"]["error"] == "CheckpointException"
        assert "rng.devrng_rank_2" in seen["rng_strict"]["msg"]
        strict = seen["rng_strict_planner"]
        assert strict["devrng"] and "holds the states of 2 rank(s) and this job has 3, so " \
            "rank 2 has none" in strict["msg"], (rank, strict)
        lenient = seen["rng_lenient_planner"]
        assert lenient["error"] is None
        assert any("saved by 2 ranks and this job has 3" in w and "rank 2 had no saved state "
                   "and took the DataLoader generators and tracked objects of the saved rank at "
                   "their place (rank modulo 2)" in w for w in lenient["warnings"]), lenient
        # Per-rank streams: rank 2's (seed rank_seed(SEED, 2)) is not rank 0's.
        streams = seen["streams_planner"]
        assert streams["devrng"] and "this rank's streams are 'per-rank' (seed" in \
            streams["msg"] and "rank 0's entry holds" in streams["msg"], streams


@pytest.mark.parametrize("change", ["2->1", "2->3", "4->2"])
def test_a_stream_every_rank_held_continues_exactly_on_any_world(jobs: Launches,
                                                                 change: str) -> None:
    saved_world = int(change.split("->")[0])
    reference = [step["shared"] for step in jobs.saved(saved_world)[0]["after"]]
    for rank, seen in enumerate(jobs.resharded(change)):
        assert seen["shared_planner"]["error"] is None, seen["shared_planner"]
        assert seen["shared_draws"] == reference, f"rank {rank}"


@pytest.mark.parametrize("change", ["2->1", "4->2"])
def test_per_rank_streams_continue_their_own_on_fewer_ranks(jobs: Launches, change: str) -> None:
    saved = jobs.saved(int(change.split("->")[0]))
    for rank, seen in enumerate(jobs.resharded(change)):
        assert seen["streams_default"]["error"] is None, seen["streams_default"]
        assert seen["per_rank_draws"] == [s["per_rank"] for s in saved[rank]["after"]]


# -- Megatron-style model-parallel streams, and a DTensor on another mesh -------------------------
def _megatron_reference(jobs: Launches, saved_world: int, tp_rank: int) -> list[Any]:
    """The draws the uninterrupted run made after the checkpoint on a rank of ``tp_rank``."""
    return [step["megatron"] for step in jobs.saved(saved_world)[tp_rank]["after"]]


@pytest.mark.parametrize("change", ["4->2", "2->4"])
def test_megatron_streams_follow_their_tensor_parallel_rank_on_another_dp_size(
        jobs: Launches, change: str) -> None:
    """dp2 x tp2 -> dp1 x tp2, and dp1 x tp2 -> dp2 x tp2: each rank continues the
    model-parallel stream of its tensor-parallel rank (the replicas' streams are alike)."""
    saved_world = int(change.split("->")[0])
    for rank, seen in enumerate(jobs.resharded(change)):
        kind = "default" if change == "4->2" else "planner"
        assert seen[f"megatron_{kind}"]["error"] is None, seen[f"megatron_{kind}"]
        assert seen["megatron_draws"] == _megatron_reference(jobs, saved_world, rank % 2)


def test_megatron_streams_of_another_tensor_parallel_size_are_refused(jobs: Launches) -> None:
    """2x2 -> 4x1 (tp 2 -> 1): the names differ, so every rank refuses."""
    for rank, seen in enumerate(jobs.resharded("4->4", tp=1)):
        refused = seen["megatron_default"]
        assert refused["devrng"] and "this rank's streams are 'model-parallel/tp1'" in \
            refused["msg"] and "'model-parallel/tp2'" in refused["msg"], (rank, refused)


@pytest.mark.parametrize("change", ["2->1", "2->3", "4->4"])
def test_portable_dtensor_draws_continue_exactly_on_another_mesh(jobs: Launches,
                                                                 change: str) -> None:
    """The shared portable stream on a new mesh (1-D of 1 or 3, or 2x2 -> 4x1): the full
    tensor of each DTensor draw is the uninterrupted run's."""
    saved_world = int(change.split("->")[0])
    reference = [step["dtensor"] for step in jobs.saved(saved_world)[0]["after"]]
    tp = 1 if change == "4->4" else None
    for rank, seen in enumerate(jobs.resharded(change, tp=tp)):
        assert seen["dtensor_draws"] == reference, f"rank {rank}"


def test_the_fsdp2_tensor_parallel_example_resumes_bitwise(tmp_path: Path) -> None:
    """examples/distributed_checkpoint.py: three torchrun jobs of 4 ranks (2x2 mesh), its own
    checks (bitwise resume on every rank, a control that differs, portable masks)."""
    env = {**run_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "distributed_checkpoint.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "OK: resumed bitwise on every rank" in proc.stdout


def test_a_portable_stream_saved_without_a_save_identity_loads_with_devrngs_planner(
        tmp_path: Path) -> None:
    """An older devrng's entry has no "save" leaf (nor "format", "digest"...): DCP's own
    planner refuses the template's extra keys; devrng's planner marks it not found, and the stream continues (unchecked).
    One process, no group."""
    import torch.distributed.checkpoint as dcp

    import devrng
    from devrng import distributed as ddist

    old = {"stream": {"devrng_rank_0": {"seed": 3, "counter": 2, "world_size": 1}}}
    dcp.save(old, checkpoint_id=str(tmp_path / "old"), no_dist=True)
    stream = devrng.portable(3)
    with pytest.raises(BaseException, match=r"Missing key in checkpoint state_dict: "
                                            r"stream\.devrng_rank_0\.(save|format|digest)"):
        dcp.load({"stream": stream}, checkpoint_id=str(tmp_path / "old"), no_dist=True)
    assert stream.counter == 0
    dcp.load({"stream": stream}, checkpoint_id=str(tmp_path / "old"), no_dist=True,
             planner=ddist.load_planner())
    assert (stream.seed, stream.counter) == (3, 2)
