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
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from tests._helpers import ROOT, run_env

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
JOB = ROOT / "tests" / "_dcp_job.py"


def _launch(root: Path, world: int, phase: str, arg: str) -> list[dict[str, Any]]:
    env = {**run_env(), "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={world}", str(JOB), phase, str(root), arg]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    label = arg.replace("/", "_")
    if proc.returncode != 0:
        errors = "\n".join(p.read_text() for p in sorted(root.glob(f"{phase}-{label}-*.err")))
        pytest.fail(f"{phase} on {world} ranks failed:\n{errors or proc.stderr[-6000:]}")
    return [json.loads((root / f"{phase}-{label}-{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dcp")


@pytest.fixture(scope="module")
def saved(root: Path) -> dict[int, list[dict[str, Any]]]:
    """The uninterrupted runs: 2 ranks (checkpoint ``ckpt2``) and 4 ranks (``ckpt4``)."""
    return {2: _launch(root, 2, "save", "ckpt2"), 4: _launch(root, 4, "save", "ckpt4")}


@pytest.fixture(scope="module")
def loaded(root: Path, saved: Any) -> dict[int, list[dict[str, Any]]]:
    """Fresh processes resuming each checkpoint on its own number of ranks."""
    return {world: _launch(root, world, "load", f"ckpt{world}/ckpt") for world in (2, 4)}


@pytest.fixture(scope="module")
def resharded(root: Path, saved: Any) -> dict[str, list[dict[str, Any]]]:
    """Checkpoints loaded on another number of ranks: 2 -> 1, 2 -> 3, 4 -> 2."""
    return {f"{a}->{b}": _launch(root, b, "reshard", f"ckpt{a}/ckpt")
            for a, b in ((2, 1), (2, 3), (4, 2))}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["ckpt", "ckpt-async"])
def test_resume_is_bitwise_the_uninterrupted_run(saved: Any, loaded: Any, world: int,
                                                 kind: str) -> None:
    for rank in range(world):
        resumed = loaded[world][rank][f"ckpt{world}/{kind}"]
        assert resumed["after"] == saved[world][rank]["after"], f"rank {rank}"
        assert resumed["weights"] == saved[world][rank]["weights"], f"rank {rank}"


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_got_its_own_state_back(saved: Any, world: int) -> None:
    """The per-rank parts differ from rank to rank: a patchwork would have repeated one."""
    for key in ("per_rank", "noise"):
        per_rank = [saved[world][r]["after"][0][key] for r in range(world)]
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
])
def test_bad_checkpoint_raises_on_every_rank_and_changes_nothing(loaded: Any, case: str,
                                                                  match: str) -> None:
    import re
    for rank, seen in enumerate(_everyone(loaded[2], case)):
        assert seen["devrng"], (rank, seen)
        assert re.search(match, seen["msg"], flags=re.S), (rank, seen["msg"])
        assert seen["unchanged"], f"rank {rank} changed a generator"


@pytest.mark.parametrize("case", ["missing_rank", "none"])
def test_missing_entry_with_dcps_planner_fails_inside_dcp_on_every_rank(loaded: Any,
                                                                       case: str) -> None:
    """DCP plans the load before devrng sees anything: its own error, on every rank."""
    for rank, seen in enumerate(_everyone(loaded[2], case)):
        assert seen["error"] == "CheckpointException", (rank, seen)
        assert "Missing key in checkpoint state_dict: rng.devrng_rank_" in seen["msg"]
        assert seen["unchanged"]


def test_shrink_refuses_or_warns_naming_both_world_sizes(resharded: Any) -> None:
    for change in ("2->1", "4->2"):
        saved_world, world = change.split("->")
        for rank, seen in enumerate(resharded[change]):
            strict = seen["rng_strict"]
            assert strict["devrng"] and f"rank 0 of {saved_world}, and this is rank 0 of " \
                f"{world}" in strict["msg"], (change, rank, strict)
            lenient = seen["rng_lenient_planner"]
            assert lenient["error"] is None, lenient
            assert any(f"saved by {saved_world} ranks and this job has {world}" in w
                       for w in lenient["warnings"]), lenient


def test_grown_world_fails_in_dcp_by_default_and_speaks_with_devrngs_planner(resharded: Any
                                                                             ) -> None:
    for rank, seen in enumerate(resharded["2->3"]):
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
def test_a_stream_every_rank_held_continues_exactly_on_any_world(saved: Any, resharded: Any,
                                                                 change: str) -> None:
    saved_world = int(change.split("->")[0])
    reference = [step["shared"] for step in saved[saved_world][0]["after"]]
    for rank, seen in enumerate(resharded[change]):
        assert seen["shared_planner"]["error"] is None, seen["shared_planner"]
        assert seen["shared_draws"] == reference, f"rank {rank}"


@pytest.mark.parametrize("change", ["2->1", "4->2"])
def test_per_rank_streams_continue_their_own_on_fewer_ranks(saved: Any, resharded: Any,
                                                            change: str) -> None:
    saved_world = int(change.split("->")[0])
    for rank, seen in enumerate(resharded[change]):
        assert seen["streams_default"]["error"] is None, seen["streams_default"]
        assert seen["per_rank_draws"] == [s["per_rank"] for s in saved[saved_world][rank]["after"]]


def test_launches_do_not_inherit_a_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs take their ranks from torchrun, never from this process's environment."""
    monkeypatch.setenv("RANK", "5")
    env = {**run_env(), "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    assert "RANK" not in env and os.environ["RANK"] == "5"
