"""``devrng check-determinism``: run a training script twice (or more) from scratch with one
seed, compare their flight records step by step, and name where they part.

The first step whose records differ is named with what differed first, in causal order:
the generators at the step's start, the batch's indices (data order), its content, and
-- all of those equal -- what the step computed (the loss, the parameters after it).
A difference in the computation is then located one level down: the script runs twice
more up to that step with every op of that step recorded (``devrng._checks.ops``), and
the first op whose inputs are equal in both runs and whose outputs are not is named,
with the module it ran in and the fix where torch knows one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from devrng._checks.ops import RANDOM_OPS, Op, Split, first_split, ops_path, read_ops
from devrng._checks.record import MAX_STEPS_VARIABLE, OPS_VARIABLE
from devrng._checks.runs import (
    CANNOT,
    DIFFERS,
    EXACT,
    CheckFailed,
    Runs,
    checked,
    last_step,
    no_steps,
    out,
    records,
)
from devrng._checks.verdict import RERUN, Verdict, judge

__all__ = ["check_determinism", "located"]


def check_determinism(command: Sequence[str], *, steps: int | None = None, runs: int = 2,
                      keep: str | None = None, locate: bool = True) -> int:
    """Run ``command`` ``runs`` times from scratch and compare; the exit status (0 the same,
    1 they differ, 2 could not check)."""
    if steps is not None and steps < 1:
        out(f"devrng check-determinism: --steps is {steps}; give 1 or more.")
        return CANNOT
    if runs < 2:
        out(f"devrng check-determinism: --runs is {runs}; give 2 or more (runs to compare).")
        return CANNOT
    return checked("check-determinism", command, keep,
                   lambda found: _check(found, steps, runs, locate))


def _check(runs: Runs, steps: int | None, count: int, locate: bool) -> int:
    limit = {MAX_STEPS_VARIABLE: str(steps)} if steps is not None else {}
    found = [records(runs.run(f"{k}/{count}", "from scratch", f"run-{k}", limit))
             for k in range(1, count + 1)]
    if last_step(found[0]) == 0:
        raise no_steps("run 1")
    ranks = sorted(found[0])
    for k, other in enumerate(found[1:], 2):
        if sorted(other) != ranks:
            raise CheckFailed(f"the runs had different ranks (run 1: {ranks}, run {k}: "
                              f"{sorted(other)}).")
    verdicts = [_verdict(found, rank, rank if len(ranks) > 1 else None) for rank in ranks]
    cannot = [v for v in verdicts if v.ok is None]
    if cannot:
        raise CheckFailed("; ".join(map(str, cannot)))
    differing = [v for v in verdicts if v.difference is not None]
    if differing and locate:
        computed = [v for v in differing if v.difference.computed]  # type: ignore[union-attr]
        if computed:
            step = min(v.difference.step or 1 for v in computed)  # type: ignore[union-attr]
            splits = _locate(runs, step, limit)
            verdicts = [_with_split(v, splits.get(v.rank or 0), step) for v in verdicts]
    for verdict in verdicts:
        out(str(verdict))
    return DIFFERS if differing else EXACT


def _verdict(found: list[dict[int, dict[str, Any]]], rank: int, label: int | None) -> Verdict:
    """One rank's verdict: every run's steps against run 1's; the earliest difference."""
    reference = _attempt(found[0][rank])
    first_last = max(reference["steps"], default=0)
    worst: Verdict | None = None
    for k, record in enumerate(found[1:], 2):
        other = _attempt(record[rank])
        last = max(other["steps"], default=0)
        verdict = judge(reference, other, 1, min(first_last, last), exact="deterministic",
                        differs=f"run {k} differs from run 1" if len(found) > 2
                        else "the runs differ", names=(f"run {k}", "run 1"), hints=RERUN)
        if verdict.difference is None and verdict.ok and last != first_last:
            verdict = Verdict(None, "", reason=(
                f"run 1 took {first_last} steps and run {k} {last}: their first "
                f"{min(first_last, last)} matched ({verdict.compared}), but a run that takes "
                "another number of steps is not the same run (a stop on the clock, or on a "
                "value that differs below what the record compares); give --steps"))
        if verdict.ok is None:
            return replace(verdict, rank=label)
        verdict = replace(verdict, span="..")
        if verdict.difference is not None and (
                worst is None or (verdict.difference.step or 0)
                < (worst.difference.step or 0)):  # type: ignore[union-attr]
            worst = verdict
        worst = worst or verdict
    assert worst is not None
    return replace(worst, rank=label)


def _attempt(record: dict[str, Any]) -> dict[str, Any]:
    """The one attempt of a run from scratch (the one with the most steps, if it has more)."""
    attempts = list(record["attempts"].values())
    return max(attempts, key=lambda a: len(a["steps"]))


def _locate(runs: Runs, step: int, limit: dict[str, str]) -> dict[int, Split | str]:
    """Run the script twice up to ``step``, recording that step's ops; where they part, by
    rank (a sentence when they could not be compared)."""
    out(f"locating the difference in step {step}: two more runs up to it, with every op of "
        "that step recorded")
    extra = {**limit, MAX_STEPS_VARIABLE: str(step), OPS_VARIABLE: str(step)}
    directories = [runs.run(f"ops {k}/2", f"step {step}, every op recorded", f"ops-{k}", extra)
                   for k in (1, 2)]
    ranks = set(records(directories[0]))
    found: dict[int, Split | str] = {}
    for rank in ranks:
        paths = [ops_path(os.path.join(d, "flight-record"), rank) for d in directories]
        if not all(os.path.exists(p) for p in paths):
            found[rank] = (f"the ops of step {step} were not recorded (the run ended before "
                           "that step ended), so the op is not named")
            continue
        split = first_split(read_ops(paths[0]), read_ops(paths[1]))
        found[rank] = split if split is not None else (
            f"the two runs that recorded every op of step {step} did not differ there (the "
            "difference does not show in every run: run the check again, or with more --runs)")
    return found


def _with_split(verdict: Verdict, split: Split | str | None, step: int) -> Verdict:
    difference = verdict.difference
    if difference is None or not difference.computed or difference.step != step \
            or split is None:
        return verdict
    if isinstance(split, str):
        return replace(verdict, difference=replace(difference, detail=split))
    # (The op's own words replace the causes a difference in the computation can have.)
    return replace(verdict, difference=replace(
        difference, hint="", module=split.op.module if split.op else None,
        op=split.op.op if split.op else None, phase=split.op.phase if split.op else None,
        detail=located(split)))


def located(split: Split) -> str:
    """Where two recordings of a step part, in words, with the known fix.

    Examples:
        >>> from devrng._checks.check_determinism import located
        >>> from devrng._checks.ops import Op, Split
        >>> op = Op(4, "mylib::fused_sum", "encoder.2", "forward", "i", "o")
        >>> located(Split("op", op, op))[:70]
        'Located: forward of module encoder.2, op mylib::fused_sum (the 5th op '
    """
    if split.kind == "path" or split.op is None:
        ours, theirs = split.op, split.other
        return ("Located: the two runs ran other ops from here on: "
                f"{_where(ours) if ours else 'run 1 ran no more ops'}; "
                f"{_where(theirs) if theirs else 'run 2 ran no more ops'}: the step's "
                "control flow depends on something that changes between runs (a branch on a "
                "value that differs, a set's or dict's order, the clock)")
    where = _where(split.op)
    if split.kind == "generator":
        return (f"Located: {where}: a random op whose inputs were equal in both runs and whose "
                "generator was in another state: it draws from a generator devrng does not "
                "seed (a generator= argument made or seeded from the clock or os.urandom); "
                "seed it from the run's seed (torch.Generator().manual_seed(rng.seed + k)) "
                "and rng.track(name, generator) so that checkpoints keep it")
    if split.kind == "input":
        return (f"Located: {where} is the first op whose inputs differ, and every op before "
                "it in the step matched: the difference comes from outside torch's ops (a "
                "tensor made from NumPy or Python values, or data a hook or callback changed)")
    return f"Located: {where}: its inputs were equal in both runs and its outputs were not: " \
           + op_hint(split.op)


def _where(op: Op) -> str:
    module = f"module {op.module}" if op.module else "no module"
    phase = {"forward": "forward of ", "backward": "backward of "}.get(op.phase, "")
    where = f"{phase}{module}" if phase else f"{op.phase} ({module})"
    return f"{where}, op {op.op} (the {_ordinal(op.index + 1)} op of the step, on {op.device})"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


#: Ops torch lists as nondeterministic on CUDA (``torch.use_deterministic_algorithms``):
#: ``devrng.deterministic()`` turns that switch on, so torch runs a deterministic kernel
#: where it has one and raises where it has none.
KNOWN = frozenset({
    "index_add", "index_add_", "index_copy", "index_copy_", "index_put", "index_put_",
    "_index_put_impl_", "put", "put_", "scatter", "scatter_", "scatter_add", "scatter_add_",
    "scatter_reduce", "scatter_reduce_", "index_reduce", "index_reduce_", "histc", "bincount",
    "kthvalue", "median", "nanmedian", "mode", "cumsum", "embedding_dense_backward",
    "_embedding_bag_backward", "embedding_bag", "ctc_loss", "nll_loss2d_backward",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d_backward", "avg_pool3d_backward", "max_pool3d_with_indices_backward",
    "fractional_max_pool2d_backward", "fractional_max_pool3d_backward", "max_unpool1d",
    "max_unpool2d", "max_unpool3d", "upsample_linear1d_backward",
    "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
    "upsample_trilinear3d_backward", "reflection_pad1d_backward", "reflection_pad2d_backward",
    "reflection_pad3d_backward", "replication_pad1d_backward", "replication_pad2d_backward",
    "replication_pad3d_backward", "grid_sampler_2d_backward", "grid_sampler_3d_backward",
    "segment_reduce", "_segment_reduce_backward", "resize_",
})
#: Ops whose CUDA kernels come from cuBLAS (its workspace reorders sums unless
#: CUBLAS_WORKSPACE_CONFIG is set before CUDA starts: deterministic() sets it) or cuDNN.
_CUBLAS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv",
                     "mv", "dot", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_flash_attention"})
_CUDNN = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                    "cudnn_batch_norm", "_cudnn_rnn", "_cudnn_rnn_backward",
                    "cudnn_convolution_transpose"})


def op_hint(op: Op) -> str:
    """What is known of ``op`` being nondeterministic, and the fix."""
    namespace, _, name = op.op.partition("::")
    base = name.split(".")[0]
    if base in RANDOM_OPS:
        return ("it draws random numbers, from a generator the two runs left in other "
                "states: one devrng does not seed; seed it from the run's seed and "
                "rng.track(name, generator)")
    if namespace not in ("aten", "prims", "_c10d_functional", "c10d"):
        return (f"it is a custom op ({namespace}, registered with torch.library or a C++ "
                "extension) whose kernel is nondeterministic: torch's determinism switches "
                "do not reach it; make its kernel reduce in a fixed order (no atomics), or "
                "give it a deterministic path")
    if base in KNOWN:
        return (f"torch knows {base} as nondeterministic on CUDA (atomic adds): "
                "turn on devrng.deterministic() at the top of the script, which makes torch "
                "use its deterministic kernel (or raise where it has none)")
    if base in _CUBLAS:
        return ("on CUDA its kernel comes from cuBLAS, which sums in another order from run "
                "to run unless CUBLAS_WORKSPACE_CONFIG is set before CUDA starts: turn on "
                "devrng.deterministic() at the top of the script, which sets it")
    if base in _CUDNN:
        return ("on CUDA its kernel comes from cuDNN, which picks algorithms by timing them "
                "(benchmark mode) and has nondeterministic ones: turn on "
                "devrng.deterministic(), which turns benchmark off and deterministic on")
    return ("torch does not list it as nondeterministic: a kernel that sums in another order "
            "from run to run (threads, atomics), or a backend's op; devrng.deterministic() may "
            "not reach it: report it with the op's name and device")

