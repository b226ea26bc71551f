"""What each process of tests/test_dcp.py runs: a small training program checkpointed with DCP.

Every rank builds the same program -- an FSDP2 (``fully_shard``) model with dropout and
its optimizer, a ``devrng.TrainingRNG``, a per-rank ``RNGStreams`` stream and a portable
stream every rank shares -- trains, and saves or loads with ``torch.distributed.checkpoint``
the way a user writes it: ``dcp.save({"model": ..., "optim": ..., "rng": rng, ...})``.
What it saw goes to a JSON file per rank, which the tests compare.

Phases (``PHASE`` below), each one launch of fresh processes:

- ``save``: train STEPS steps, save with ``dcp.save`` and ``dcp.async_save`` (and a few
  forged checkpoints for the bad-input tests), then train STEPS more steps: the
  uninterrupted run.
- ``load``: load the checkpoint in fresh processes and train STEPS steps: must equal the
  uninterrupted run bitwise when the world size is the same; then every bad checkpoint.
- ``reshard``: load a checkpoint saved by another number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tests._helpers import resealed
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import devrng
from devrng import distributed as ddist

SEED = 1234
SHARED_SEED = 77  # the portable stream every rank holds alike
STEPS = 3


class Program:
    """One rank's training program."""

    def __init__(self, *, strict: bool = True, seed: int = SEED, extra: bool = False,
                 tp: int | None = None, flight: Path | None = None) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # Megatron-style: ranks numbered data-parallel outermost; the model-parallel stream
        # is seeded from the tensor-parallel rank and named after the tensor-parallel size.
        self.tp = tp or min(2, self.world)
        self.megatron = devrng.RNGStreams()
        self.mp = f"model-parallel/tp{self.tp}"
        self.megatron.add(self.mp, ddist.rank_seed(SEED, self.rank % self.tp))
        # A DTensor drawn inside the shared portable stream, on a 2-D mesh where there are 4
        # ranks (dp x tp), else 1-D: its full tensor is the same on any mesh.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        shape = (self.world // self.tp, self.tp) if self.world >= 4 else (self.world,)
        self.mesh = init_device_mesh("cpu", shape)
        self.placements = [Shard(0), Shard(1)][:len(shape)]
        self.rng = devrng.TrainingRNG(seed, strict=strict, flight_record=flight)
        self.loader_kwargs = self.rng.dataloader_kwargs()
        self.noise = self.rng.track("noise", torch.Generator().manual_seed(100 + self.rank))
        self.flaky = self.rng.track("flaky", Flaky())
        if extra:
            self.rng.track("extra", torch.Generator())
        self.portable = self.rng.portable()  # tracked: the run's portable stream
        self.streams = devrng.RNGStreams()  # Megatron-style: one stream per rank
        self.streams.add("per-rank", ddist.rank_seed(SEED, self.rank))
        self.shared = devrng.portable(SHARED_SEED)  # every rank holds it alike
        from torch.distributed.fsdp import fully_shard
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        fully_shard(self.model)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        if self.rng.flight is not None:  # each rank's own record file
            self.rng.flight.watch_optimizer(self.optim)

    def states(self) -> dict[str, Any]:
        """The DCP state dict, as a user writes it."""
        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim, "rng": self.rng, "streams": self.streams,
                "shared": self.shared, "megatron": self.megatron}

    def after_load(self, states: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=states["model"],
                       optim_state_dict=states["optim"])

    def step(self) -> dict[str, Any]:
        x = torch.randn(4, 8)  # the global CPU generator (the same on every rank)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.optim.step()
        self.optim.zero_grad()
        with self.streams.fork("per-rank", devices=[]):
            per_rank = torch.rand(3)
        with self.shared:
            shared = torch.nn.functional.dropout(torch.ones(6), 0.5)
        with self.portable:
            run_portable = torch.rand(2)
        with self.megatron.fork(self.mp, devices=[]):
            megatron = torch.rand(2)
        from torch.distributed.tensor import distribute_tensor
        ones = distribute_tensor(torch.ones(4, 6), self.mesh, self.placements)
        with self.shared:
            mask = torch.nn.functional.dropout(ones, 0.5).full_tensor()
        return {"loss": loss.item(), "per_rank": per_rank.tolist(), "shared": shared.tolist(),
                "megatron": megatron.tolist(), "dtensor": mask.tolist(),
                "portable": run_portable.tolist(),
                "noise": torch.rand(2, generator=self.noise).tolist(),
                "loader": torch.rand(2, generator=self.loader_kwargs["generator"]).tolist()}

    def weights(self) -> str:
        h = hashlib.sha256()
        for p in self.model.parameters():
            h.update(p.full_tensor().detach().numpy().tobytes())
        return h.hexdigest()[:16]

    def fingerprint(self) -> str:
        """Every generator devrng restores here, hashed: equal before and after a refused load."""
        h = hashlib.sha256()
        for part in (devrng.get_rng_state().fingerprint(), self.noise.get_state(),
                     self.loader_kwargs["generator"].get_state(), _state(self.streams),
                     _state(self.shared), _state(self.portable)):
            h.update(part.numpy().tobytes() if isinstance(part, torch.Tensor)
                     else str(part).encode())
        return h.hexdigest()[:16]


def _state(obj: Any) -> Any:
    """A devrng object's plain state without its save identity and the digest that covers it
    (both new with every state_dict())."""
    import io
    (entry,) = obj.state_dict().values()
    plain = torch.load(io.BytesIO(entry), weights_only=True) if isinstance(entry, bytes) \
        else dict(entry)
    del plain["save"], plain["digest"]
    return plain


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """What ``fn(*args, **kwargs)`` raised and warned (the exception's class, message, whether
    devrng's, and devrng's warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(*args, **kwargs)
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            return {"error": type(err).__name__, "msg": str(err),
                    "devrng": isinstance(err, devrng.DevRNGError),
                    "warnings": [str(w.message) for w in caught
                                 if issubclass(w.category, devrng.DevRNGWarning)]}
    return {"error": None, "warnings": [str(w.message) for w in caught
                                        if issubclass(w.category, devrng.DevRNGWarning)]}


def train(program: Program, steps: int) -> list[dict[str, Any]]:
    return [program.step() for _ in range(steps)]


# -- forged checkpoints (bad input), written by the save phase ------------------------------
class Forged:
    """A Stateful that saves what ``make(rank)`` returns: another program's or a broken entry."""

    def __init__(self, make: Callable[[int], dict[str, Any]]) -> None:
        self.make = make

    def state_dict(self) -> dict[str, Any]:
        return self.make(dist.get_rank())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    import io
    (raw,) = entry.values()
    return dict(torch.load(io.BytesIO(raw), weights_only=True))


def _changed(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A TrainingRNG entry with ``changes`` made to its plain state, sealed again (so that a
    load reaches the checks behind the digest)."""
    import io
    (key, _), = entry.items()
    buffer = io.BytesIO()
    torch.save(resealed({**_plain(entry), **changes}), buffer)
    return {key: buffer.getvalue()}


def _flipped(entry: dict[str, Any]) -> dict[str, Any]:
    """A TrainingRNG entry with one bit flipped in its CPU generator's bytes."""
    import io
    (key, raw), = entry.items()
    cpu = torch.load(io.BytesIO(raw), weights_only=True)["rng"]["cpu"]
    data = bytearray(raw)
    data[raw.find(bytes(cpu.numpy().tobytes())) + 100] ^= 1
    return {key: bytes(data)}


def save_forged(program: Program, root: Path) -> None:
    model, optim = get_state_dict(program.model, program.optim)
    base = {"model": model, "optim": optim}
    # Every rank makes every state (state_dict() agrees on a save identity across the ranks).
    own = program.rng.state_dict()
    torch.rand(1)
    later = program.rng.state_dict()  # the next save, one draw later
    other = devrng.TrainingRNG(SEED + 1).state_dict()
    # Another run's state on rank 1, under this save's identity: the seeds tell them apart.
    other_seed = _changed(other, save=_plain(own)["save"])
    newer = _changed(own, version=99)
    flipped = _flipped(own)
    entries: list[Any] = [None] * dist.get_world_size()  # every rank's entry, to swap them
    dist.all_gather_object(entries, next(iter(own.values())))
    torch.manual_seed(SEED + 50)  # the forged objects above seeded: draw on from a known state
    cases: dict[str, Callable[[int], dict[str, Any]]] = {
        "corrupt": lambda r: own if r != 1 else {"devrng_rank_1": b"PK\x03\x04 not a zip archive"},
        "newer": lambda r: newer if r == 0 else own,
        "other_seed": lambda r: other_seed if r == 1 else own,
        "missing_rank": lambda r: {} if r == 1 else own,
        # What a directory overwritten in place holds when rank 1 died before writing its
        # file (and the entries' sizes let the old metadata read rank 0's new file).
        "mixed": lambda r: later if r == 0 else own,
        "flipped": lambda r: flipped if r == 1 else own,
        "swapped": lambda r: {f"devrng_rank_{r}": entries[(r + 1) % len(entries)]},
    }
    for name, make in cases.items():
        dcp.save({**base, "rng": Forged(make)}, checkpoint_id=str(root / f"bad-{name}"))
    dcp.save(base, checkpoint_id=str(root / "bad-none"))


# -- phases -------------------------------------------------------------------------------
def save(root: Path) -> dict[str, Any]:
    program = Program(flight=root / "flight")
    first = train(program, STEPS)
    out: dict[str, Any] = {"first": first}
    dcp.save(program.states(), checkpoint_id=str(root / "ckpt"))
    # async_save takes the state when called: the next step's draws must not leak into it.
    group = dist.new_group(backend="gloo")
    pending = dcp.async_save(program.states(), checkpoint_id=str(root / "ckpt-async"),
                             process_group=group)
    out["after"] = train(program, 1)
    pending.result()
    out["after"] += train(program, STEPS - 1)
    out["weights"] = program.weights()
    out["shared_counter"] = program.shared.counter
    save_forged(program, root)
    return out


def load(root: Path, ckpt: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (ckpt, f"{ckpt}-async"):
        program = Program(flight=(root / ckpt).parent / "flight")
        states = program.states()
        dcp.load(states, checkpoint_id=str(root / name))
        program.after_load(states)
        out[name] = {"after": train(program, STEPS), "weights": program.weights()}
        assert program.rng.flight is not None
        program.rng.flight.finish()
        out[name]["verified"] = program.rng.flight.verified
    out["bad"] = bad_inputs((root / ckpt).parent)
    return out


def bad_inputs(root: Path) -> dict[str, Any]:
    """Each bad checkpoint loaded on every rank: what each rank raised, and whether any
    generator changed."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    out: dict[str, Any] = {}
    planner = ddist.load_planner

    def partial() -> DefaultLoadPlanner:  # DCP's own: skips keys the checkpoint lacks, silently
        return DefaultLoadPlanner(allow_partial_load=True)

    program = Program()
    for name, make, kwargs in [
        ("corrupt", Program, {}), ("newer", Program, {}), ("other_seed", Program, {}),
        ("missing_rank", Program, {}), ("missing_rank_planner", Program, {"planner": planner}),
        ("missing_rank_partial", Program, {"planner": partial}),
        ("none", Program, {}), ("none_planner", Program, {"planner": planner}),
        ("none_partial", Program, {"planner": partial}), ("mixed", Program, {}),
        ("live_seed", lambda: Program(seed=SEED + 7), {}),
        ("tracked", lambda: Program(extra=True), {}),
        ("apply_fails", Program, {}), ("pair", Program, {}), ("flipped", Program, {}),
        ("swapped", Program, {}),
    ]:
        program = make()
        ckpt = root / ("ckpt" if name in ("live_seed", "tracked", "apply_fails", "pair")
                       else f"bad-{name.removesuffix('_planner').removesuffix('_partial')}")
        program.flaky.fail = name == "apply_fails" and program.rank == 1
        before = program.fingerprint()
        states: dict[str, Any] = {"rng": program.rng}
        if name == "pair":  # the TrainingRNG loads first (key order), then the stream refuses
            states["shared"] = devrng.portable(SHARED_SEED + 1)
        kw = {k: v() for k, v in kwargs.items()}
        out[name] = attempt(dcp.load, states, checkpoint_id=str(ckpt), **kw)
        out[name]["unchanged"] = program.fingerprint() == before

    return out


class Flaky:
    """A tracked object whose load can be made to fail (after the ranks agreed to load)."""

    def __init__(self) -> None:
        self.fail = False
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        if self.fail:
            self.fail = False  # once: putting it back works
            raise RuntimeError("simulated failure while applying")
        self.value = state_dict["value"]


def reshard(root: Path, ckpt: str, tp: int | None = None) -> dict[str, Any]:
    """Load a checkpoint of another world size, each object on its own, with and without
    devrng's planner; record errors, warnings and the draws that follow."""
    out: dict[str, Any] = {}
    path = str(root / ckpt)
    for label, strict, planner in [("strict", True, None), ("strict_planner", True, True),
                                   ("lenient_planner", False, True)]:
        program = Program(strict=strict)
        kw = {"planner": ddist.load_planner()} if planner else {}
        out[f"rng_{label}"] = attempt(dcp.load, {"rng": program.rng}, checkpoint_id=path, **kw)
    program = Program(tp=tp)
    for key, obj in (("shared", program.shared), ("streams", program.streams),
                     ("megatron", program.megatron)):
        for label, kw in (("default", {}), ("planner", {"planner": ddist.load_planner()})):
            out[f"{key}_{label}"] = attempt(dcp.load, {key: obj}, checkpoint_id=path, **kw)
    steps = train(program, STEPS)
    for key in ("shared", "per_rank", "megatron", "dtensor"):
        out[f"{key}_draws"] = [step[key] for step in steps]
    return out


def main() -> None:
    phase, root, arg = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    tp = int(sys.argv[4]) if len(sys.argv) > 4 else None
    label = arg.replace("/", "_") + (f"-tp{tp}" if tp else "")
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=int(os.environ.get(
        "DEVRNG_TEST_TIMEOUT", "120"))))
    try:
        result = {"save": lambda: save(root / arg), "load": lambda: load(root, arg),
                  "reshard": lambda: reshard(root, arg, tp)}[phase]()
        dist.barrier()
    except BaseException:
        Path(root, f"{phase}-{label}-{rank}.err").write_text(
            traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    Path(root, f"{phase}-{label}-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
