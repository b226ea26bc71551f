"""Verdicts: two runs' records of one step told apart in words, as a value.

A ``Difference`` is where two records of the same step part first, in causal order
(generators at the step's start, the number of batches, the batch's indices, its
content, the loss, the parameters after the step), with the known causes of that part.
A ``Verdict`` is what a check concluded: exact over which steps and parts, a difference,
or that it could not check and why. The commands, the record's warning and the
trainers' loggers all print these values; the words live here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from devrng._checks.compare import LOADER_PREFIX, PARTS, count_parts
from devrng._checks.ops import RANDOM_OPS, Op, Split

__all__ = ["RERUN", "RESUME", "Difference", "Verdict", "compared_text",
           "damaged", "difference", "explain", "judge", "located", "not_found", "nothing_after",
           "op_hint"]

_UNTRACKED = ("a generator devrng does not track (one kept on the dataset or the model, or "
              "made in the loop: rng.track(name, generator) saves and restores it)")
#: The known causes of each kind of difference between a resumed run and the interrupted one.
RESUME = {
    "content": ("randomness inside the dataset or collate_fn that devrng does not see (a "
                "shuffle or augmentation there: draw it inside devrng.sample_rng(index), or "
                "seed it from the batch's indices), or "
                + _UNTRACKED),
    # The batch read at the model's input (HF Trainer, accelerate): the loop had it before.
    "model input": ("randomness the batch met before the model's forward pass: in the dataset "
                    "or collate_fn (draw it inside devrng.sample_rng(index)), or in the training "
                    "loop (noise added to the inputs), from " + _UNTRACKED
                    + " or from a generator the two runs left in other states"),
    "unordered": ("the loader is built with in_order=False: its workers hand over the batches "
                  "in the order they finish them, which changes from run to run, even between "
                  "two uninterrupted runs; build it with in_order=True (the default)"),
    "indices": ("the loader's sampler shuffled differently (a sampler with a generator of its "
                "own, or one a loader fast-forwards by iterating it again: build the loader "
                "with **rng.dataloader_kwargs() and use torchdata's StatefulDataLoader)"),
    "count": "another number of batches per optimizer step (gradient accumulation or the loader)",
    "computed": ("nondeterministic kernels (turn on devrng.deterministic()), model or "
                 "optimizer state the checkpoint does not hold (momentum, a gradient accumulated "
                 "inside a window, an LR scheduler, a GradScaler, a buffer), or a draw in the "
                 "step from " + _UNTRACKED),
    "generator": ("something drew from it in one run and not in the other between the "
                  "checkpoint and this step, or its state was not restored"),
}
#: The same between two runs of a script from scratch (``devrng check-determinism``).
RERUN = {
    **RESUME,
    "indices": ("the loader's order comes from a source devrng does not seed (a sampler with "
                "a generator of its own seeded from the clock or os.urandom, or a shuffle in "
                "the dataset): build the loader with **rng.dataloader_kwargs()"),
    "computed": ("a nondeterministic operation in the forward or backward pass (turn on "
                 "devrng.deterministic() at the top of the script), or a draw in the step from "
                 + _UNTRACKED + " seeded from the clock or os.urandom"),
    "generator": ("the two runs drew from it a different number of times before this step, or "
                  "seeded it from something that changes (the clock, os.urandom, a process "
                  "id): seed it from devrng (DEVRNG_SEED, TrainingRNG(seed=...))"),
}


@dataclass(frozen=True)
class Difference:
    """Where two records of one step part first.

    ``part`` is what differed first, in causal order: ``"generators"``, ``"batch count"``,
    ``"batch order"`` (a loader with ``in_order=False``), ``"batch indices"``, ``"batch
    content"``, ``"loss"`` or ``"parameters"``; ``where`` names the step (and the batch's
    place in its epoch), ``what`` says what differed and ``hint`` its known causes. A
    check that goes further down names the ``module``, ``op`` and ``phase`` and says so in
    ``detail``.
    """

    step: int | None
    part: str
    where: str
    what: str
    hint: str
    module: str | None = None
    op: str | None = None
    phase: str | None = None
    detail: str = ""

    @property
    def computed(self) -> bool:
        """Whether everything a step started from and consumed was equal, and what it
        computed was not (the cause is in the computation)."""
        return self.part in ("loss", "parameters")

    def __str__(self) -> str:
        hint = f": {self.hint}" if self.hint else ""
        detail = f". {self.detail}" if self.detail else ""
        return f"{self.where}: {self.what}{hint}{detail}"


@dataclass(frozen=True)
class Verdict:
    """What a check of two runs concluded: ``ok`` (True: exact; False: they differ; None:
    it could not check, ``reason`` says why), over ``steps`` (first, last), having compared
    ``compared``; a difference found is ``difference``. ``str()`` is the sentence to print.

    Examples:
        >>> from devrng._checks.verdict import Verdict
        >>> print(Verdict(True, "deterministic", steps=(1, 5), compared="generators at every step"))
        deterministic for steps 1 to 5 (compared: generators at every step)
    """

    ok: bool | None
    what: str
    steps: tuple[int, int] | None = None
    compared: str = ""
    difference: Difference | None = None
    reason: str = ""
    rank: int | None = None
    context: str = ""  # said before what was compared: "checkpoint at step 10"
    span: str = " to "  # between the first and last step: "steps 1 to 5", "steps 1..5"

    def __str__(self) -> str:
        label = f"rank {self.rank}: " if self.rank is not None else ""
        if self.ok is None:
            return f"{label}{self.reason}"
        if self.difference is not None:
            return f"{label}{self.what} at {self.difference}"
        first, last = self.steps or (0, 0)
        context = f"{self.context}; " if self.context else ""
        return (f"{label}{self.what} for steps {first}{self.span}{last} ({context}compared: "
                f"{self.compared})")

    def with_rank(self, rank: int | None) -> Verdict:
        """This verdict, said of rank ``rank`` (None: of the only process)."""
        return replace(self, rank=rank)


def judge(reference: Mapping[str, Any], other: Mapping[str, Any], first: int, last: int, *,
          exact: str, differs: str, names: tuple[str, str], after: str = "",
          hints: Mapping[str, str] = RESUME) -> Verdict:
    """The verdict over steps ``first`` to ``last`` of two attempts of a record (as
    ``read_record`` gives them): the first step whose lines differ, or exact when every
    step was compared in full, or why it could not be. ``exact`` and ``differs`` begin the
    verdict's sentence; ``names`` are the attempts' in words (``other``'s first), ``after``
    where the steps begin ("after the checkpoint of step 10")."""
    for step in range(first, last + 1):
        theirs, ours = reference["steps"].get(step), other["steps"].get(step)
        if theirs is None or ours is None:
            continue  # (a step only one run recorded: told apart below)
        found = difference(theirs[0], theirs[1], ours[0], ours[1], hints)
        if found is not None:
            return Verdict(False, differs, difference=found)
    # Exact only when every step was compared, in full.
    missing = [s for s in range(first, last + 1) if s not in other["steps"]]
    if missing:
        done = last - first + 1 - len(missing)
        return Verdict(None, exact, reason=(
            f"{names[0]} recorded {done} step{'' if done == 1 else 's'} of the "
            f"{last - first + 1}{after} that "
            f"{names[1]} recorded (none from step {missing[0]}); it was not compared in full: "
            "did it end early, or fail?"))
    pairs = [(reference["steps"][s][0], other["steps"][s][0]) for s in range(first, last + 1)]
    counts = count_parts(pairs)
    # What the reference recorded at every step, the other must have too.
    needed = [name for key, name in PARTS if key in ("g", "w")
              and all(ref.get(key) is not None for ref, _ in pairs)]
    lacking = [name for name in needed if counts.get(name, 0) < len(pairs)]
    if lacking:
        return Verdict(None, exact, reason=(
            f"steps {first} to {last} matched, but the {' and '.join(lacking)} were not "
            "recorded at every one of them by both runs, so they were not compared in full."))
    return Verdict(True, exact, steps=(first, last), compared=compared_text(counts, len(pairs)))


def compared_text(counts: Mapping[str, int], steps: int) -> str:
    """What ``steps`` compared steps compared, from how many compared each part: the parts
    compared at every step, then the others with their counts, and what none compared.

    Examples:
        >>> from devrng._checks.verdict import compared_text
        >>> compared_text({"generators": 4, "parameters": 4, "loss": 1}, 4)
        'generators, parameters at every step; loss at 1 of 4; not batch indices, batch content'
    """
    every = [name for _, name in PARTS if counts.get(name, 0) >= steps]
    some = [f"{name} at {counts[name]} of {steps}" for _, name in PARTS
            if 0 < counts.get(name, 0) < steps]
    none = [name for _, name in PARTS if not counts.get(name)]
    text = [f"{', '.join(every)} at every step"] if every else []
    text += some
    if none:
        text.append("not " + ", ".join(none))
    return "; ".join(text)


def _generator_hint(name: str, hints: Mapping[str, str]) -> str:
    if name in ("python", "numpy"):
        which = "Python" if name == "python" else "NumPy"
        if hints is RERUN:
            return (f"something drew from the {which} global generator a different number of "
                    "times in the two runs (a collate_fn, a callback, a library), or seeded it "
                    "from something that changes")
        return (f"something drew from the {which} global generator in one run and not in the "
                "other (a collate_fn, a callback, a library) or its state was not restored")
    return hints["generator"]


def difference(theirs: Mapping[str, Any], their_names: list[str], ours: Mapping[str, Any],
               our_names: list[str], hints: Mapping[str, str] = RESUME) -> Difference | None:
    """Where two records of the same step differ first, or None when they match.

    Examples:
        >>> from devrng._checks.verdict import difference
        >>> a = {"s": 7, "g": ["0a", "0b"], "n": 1, "b": "c1", "i": "d1"}
        >>> difference(a, ["cpu", "numpy"], dict(a, i="d2", b="c2"), ["cpu", "numpy"]).part
        'batch indices'
        >>> difference(a, ["cpu", "numpy"], a, ["cpu", "numpy"]) is None
        True
    """
    step = ours.get("s")
    where = f"step {step:,}" if isinstance(step, int) else "a step"
    position = ours.get("p")
    if isinstance(position, list) and len(position) == 2 and position[1] is not None:
        where += f" (batch {position[1] + 1} of its epoch from loader {position[0]!r})"
    step = step if isinstance(step, int) else None

    def found(part: str, what: str, hint: str) -> Difference:
        return Difference(step, part, where, what, hint)

    theirs_g = dict(zip(their_names, theirs.get("g") or [], strict=False))
    ours_g = dict(zip(our_names, ours.get("g") or [], strict=False))
    differ = [n for n in ours_g if n in theirs_g and theirs_g[n] != ours_g[n]]
    # A loader's own generators act only through its batches, and it draws from them when it
    # prefetches (how far ahead: its workers): on their own they say nothing; beside a batch
    # that differs, they tell why.
    primary = [n for n in differ if not n.startswith(LOADER_PREFIX)]
    loaders = [n.removeprefix(LOADER_PREFIX) for n in differ if n.startswith(LOADER_PREFIX)]
    if primary:
        same = [n.removeprefix(LOADER_PREFIX) for n in ours_g if n in theirs_g and n not in differ]
        return found("generators", f"at the step's start the generator"
                     f"{'s' if len(primary) > 1 else ''} {', '.join(primary)} differed"
                     + (f" ({', '.join(same)} matched)" if same else ""),
                     _generator_hint(primary[0], hints))
    also = (f" (the loader's generator{'s' if len(loaders) > 1 else ''} {', '.join(loaders)} "
            "differed at the step's start too)") if loaders else ""
    if theirs.get("n") != ours.get("n"):
        return found("batch count", f"the step consumed {ours.get('n') or 0} batch(es) here and "
                     f"{theirs.get('n') or 0} in the other run{also}", hints["count"])
    if theirs.get("b") != ours.get("b"):
        if theirs.get("u") or ours.get("u"):
            return found("batch order", f"the batch differs{also}", hints["unordered"])
        content = hints["model input" if ours.get("m") else "content"]
        if theirs.get("i") is not None and ours.get("i") is not None:
            if theirs["i"] == ours["i"]:
                return found("batch content",
                             f"the batch's indices match and its content does not{also}", content)
            return found("batch indices", f"the batch holds other samples (its indices "
                         f"differ){also}", hints["indices"])
        return found("batch content", f"the batch's content differs (its indices were not "
                     f"recorded){also}", f"{hints['indices']}, or {content}")
    seen = theirs.get("b") is not None and ours.get("b") is not None
    for key, part, what in (("l", "loss", "the loss"),
                            ("w", "parameters", "the parameters after the step")):
        if theirs.get(key) is not None and ours.get(key) is not None and theirs[key] != ours[key]:
            if seen:
                return found(part, f"the batch and every generator matched and {what} did "
                             "not", hints["computed"])
            # No batch recorded: the data cannot be told apart from the computation.
            return found(part, f"every generator matched and {what} did not (no batch was "
                         "recorded: the step took none from a DataLoader devrng tracks)",
                         f"{hints['computed']}; or the data: track the loader "
                         "(rng.track(name, loader)) so that its batches are compared")
    return None


def explain(theirs: Mapping[str, Any], their_names: list[str], ours: Mapping[str, Any],
            our_names: list[str]) -> str | None:
    """Where two records of the same step differ, as the words after "at", or None.

    Examples:
        >>> from devrng._checks.verdict import explain
        >>> a = {"s": 7, "g": ["0a", "0b"], "n": 1, "b": "c1", "i": "d1"}
        >>> explain(a, ["cpu", "numpy"], dict(a, b="c2"), ["cpu", "numpy"])[:59]
        "step 7: the batch's indices match and its content does not:"
        >>> explain(a, ["cpu", "numpy"], dict(a, g=["0a", "0c"]), ["cpu", "numpy"])[:56]
        "step 7: at the step's start the generator numpy differed"
        >>> explain(a, ["cpu", "numpy"], a, ["cpu", "numpy"]) is None
        True
    """
    found = difference(theirs, their_names, ours, our_names)
    return None if found is None else str(found)


# -- why a resume cannot be compared --------------------------------------------------------------

def not_found(lines: list[dict[str, Any]], key: str | None, where: str) -> str:
    """Why the record in ``where`` holds no line of the checkpoint ``key``, in words."""
    if not key:
        return ("the checkpoint was saved with the flight record off (or by a devrng before "
                "0.5), so the record cannot know it")
    if not any(line.get("k") == "ckpt" for line in lines):
        return (f"the flight record in {where} holds no checkpoint at all: the checkpoint was "
                "saved with the record kept elsewhere, or the record was removed")
    return (f"the flight record in {where} belongs to another run: it holds no entry for this "
            "checkpoint (another run saved its checkpoints there, with its own keys)")


def nothing_after(lines: list[dict[str, Any]], index: int, attempt: str, step: int,
                  keep: int) -> str:
    """Why the attempt that wrote the checkpoint at line ``index`` has no step after it."""
    mine = [line for line in lines[index + 1:] if line.get("a") == attempt]
    later = [line.get("s") for line in mine if line.get("k") == "ckpt"]
    if any(line.get("k") in ("done", "end") for line in mine) and not later:
        return (f"the run that saved this checkpoint ended there (step {step:,}), so no step of "
                "it follows the checkpoint to compare with")
    if later:
        return (f"the record no longer holds the steps after the checkpoint of step {step:,} "
                f"(it keeps those after the last {keep} checkpoints; the "
                f"interrupted run saved again at step {later[-1]:,})")
    return (f"the interrupted run's record ends at its checkpoint (step {step:,}): it stopped "
            "before it finished another step")


def damaged(count: int) -> str:
    return f"; {count} damaged line(s) of the record were skipped" if count else ""


# -- where two recordings of ops part, in words --------------------------------------------------

def located(split: Split, *, within: str = "step", runs: tuple[str, str] = ("run 1", "run 2"),
            at: str = "") -> str:
    """Where two recordings of a ``within`` (a step, a call) part, in words, with the known
    fix; ``runs`` names the two recordings, ``at`` is said after "Located".

    Examples:
        >>> from devrng._checks.verdict import located
        >>> from devrng._checks.ops import Op, Split
        >>> op = Op(4, "mylib::fused_sum", "encoder.2", "forward", "i", "o")
        >>> located(Split("op", op, op))[:70]
        'Located: forward of module encoder.2, op mylib::fused_sum (the 5th op '
    """
    if split.kind == "path" or split.op is None:
        ours, theirs = split.op, split.other
        mine = _where(ours, within) if ours else f"{runs[0]} ran no more ops"
        other = _where(theirs, within) if theirs else f"{runs[1]} ran no more ops"
        return (f"Located{at}: the two runs ran other ops from here on: {mine}; {other}: the "
                f"{within}'s control flow depends on something that changes between runs (a "
                "branch on a value that differs, a set's or dict's order, the clock)")
    where = _where(split.op, within)
    if split.kind == "generator":
        return (f"Located{at}: {where}: a random op whose inputs were equal in both runs and "
                "whose generator was in another state: it draws from a generator devrng does not "
                "seed (a generator= argument made or seeded from the clock or os.urandom); "
                "seed it from the run's seed (torch.Generator().manual_seed(rng.seed + k)) "
                "and rng.track(name, generator) so that checkpoints keep it")
    if split.kind == "input":
        return (f"Located{at}: {where} is the first op whose inputs differ, and every op "
                f"before it in the {within} matched: the difference comes from outside torch's "
                "ops (a tensor made from NumPy or Python values, or data a hook or callback "
                "changed)")
    # (XLA runs a step's ops as compiled graphs: reading one op's result runs the graph up
    # to it, so the first values to part can come after the op that made them part.)
    lazy = (". On XLA the op named is where the runs' values were first seen to part, which "
            "can be after the op that made them part") if split.op.device == "xla" else ""
    return (f"Located{at}: {where}: its inputs were equal in both runs and its outputs were "
            "not: " + op_hint(split.op) + lazy)


def _where(op: Op, within: str) -> str:
    module = f"module {op.module}" if op.module else "no module"
    phase = {"forward": "forward of ", "backward": "backward of "}.get(op.phase, "")
    where = f"{phase}{module}" if phase else f"{op.phase} ({module})"
    nth = _ordinal(op.index + 1)
    return f"{where}, op {op.op} (the {nth} op of the {within}, on {op.device})"


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
    if namespace in ("c10d", "_c10d_functional"):
        return ("it is a collective: its inputs were equal on this rank, so the difference "
                "came from another rank through it (see that rank's verdict), or the "
                "collective reduced in another order than in the other run")
    if namespace not in ("aten", "prims"):
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

