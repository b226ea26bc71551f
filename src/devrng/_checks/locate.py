"""Where a computation parts, in one process: between runs on one device, or between two
devices -- the machinery of ``devrng.testing.locate_divergence``.

Between runs, each run is recorded op by op (``Ops``, forward and then the backward
pass) and the recordings are walked with ``first_split``. Between devices, the
reference device runs the model once with hooks that keep every module call's inputs
and output; then each module, in the order its call ended (a module's children before
it), runs on the other device from the reference's inputs, so that error does not pile
up through the layers. The first module whose output leaves tolerance has every op of
its forward recorded on both devices, and the first op whose output leaves tolerance is
named. Comparing values is the caller's (``differs``): this module does not judge.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from devrng._checks.ops import UNINITIALISED, Op, Ops, Split, first_split, on_cpu
from devrng._checks.verdict import located

__all__ = ["Found", "between_devices", "between_runs"]

#: ``differs(value, reference)``: whether a value is too far from its reference.
Differs = Callable[[Any, Any], bool]
#: How to take the RNG state and put it back.
Rng = tuple[Callable[[], Any], Callable[[Any], None]]


@dataclass(frozen=True)
class Found:
    """Where two runs or devices part. ``kind`` is ``first_split``'s (``"op"``,
    ``"generator"``, ``"input"``, ``"path"``), ``"module"`` (a module's output differs and
    no op of it could be named) or ``"output"`` (every op matched, the outputs did not).
    ``ours`` / ``theirs`` are the reference's and the other's values there (on the CPU;
    None when there is nothing to measure), ``detail`` the words."""

    kind: str
    module: str | None
    op: str | None
    phase: str | None
    ours: Any
    theirs: Any
    detail: str
    other: str  # what is compared with the reference ("run 2", "xla:0")


@dataclass(frozen=True)
class _Run:
    ops: list[Op]
    outputs: list[Any]  # each op's outputs, on the CPU
    result: Any  # fn's output and the gradients, on the CPU
    forward: int  # how many ops the forward pass ran


# -- between runs ---------------------------------------------------------------------------
def between_runs(fn: Callable[..., Any], inputs: Sequence[Any], runs: int,
                 reset: Callable[[], None], differs: Differs) -> tuple[Found | None, str]:
    """Run ``fn(*inputs)`` ``runs`` times, calling ``reset`` before each (the same RNG
    state); where a run first parts from run 1, or None, and what was compared."""
    first: _Run | None = None
    for k in range(1, runs + 1):
        reset()
        run = _record(fn, tree_map(_fresh, tuple(inputs)))  # (fn may write to its inputs)
        if first is None:
            first = run
            continue
        split = first_split(first.ops, run.ops)
        if split is not None:
            return _found(split, first, run, k), _ran(fn, first, runs)
        if differs(run.result, first.result):
            return Found("output", None, None, None, first.result, run.result, (
                f"Every op matched in run {k} and run 1 and their outputs did not: the "
                "difference comes from outside torch's ops (Python or NumPy values)"),
                f"run {k}"), _ran(fn, first, runs)
    assert first is not None
    return None, _ran(fn, first, runs)


def _fresh(value: Any) -> Any:
    """A copy of a tensor input that requires grad as it does (other values as they are)."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().clone().requires_grad_(value.requires_grad)


def _ran(fn: Callable[..., Any], run: _Run, runs: int) -> str:
    backward = len(run.ops) - run.forward
    where = f" on {run.ops[0].device}" if run.ops else ""
    passes = (f"forward ({run.forward} ops) and backward ({backward} ops)" if backward
              else f"forward ({run.forward} ops; no output requires grad)")
    return f"{runs} runs of {_name(fn)}{where}, {passes}"


def _record(fn: Callable[..., Any], inputs: Sequence[Any]) -> _Run:
    """One run with every op recorded: forward, then backward from a gradient of ones
    (``torch.autograd.grad``: nothing accumulates in ``.grad`` from run to run)."""
    with Ops(keep=True) as ops:
        out = fn(*inputs)
        forward = len(ops.ops)
        grads = _backward(out)
    return _Run(ops.ops, ops.outputs, on_cpu((out, grads)), forward)


def _backward(out: Any) -> tuple[Any, ...]:
    roots = [t for t in tree_flatten(out)[0]
             if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = _leaves(roots)
    if not leaves:
        return ()
    return torch.autograd.grad(roots, leaves, [torch.ones_like(t) for t in roots],
                               allow_unused=True)


def _leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors requiring grad that ``roots`` were computed from (parameters, inputs)."""
    found = {id(t): t for t in roots if t.grad_fn is None}
    stack: list[Any] = [t.grad_fn for t in roots if t.grad_fn is not None]
    seen: dict[int, Any] = {}  # (the nodes kept: a freed node's id may be another's)
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)  # an AccumulateGrad node's leaf
        if isinstance(variable, torch.Tensor):
            found.setdefault(id(variable), variable)
        stack.extend(child for child, _ in node.next_functions)
    return list(found.values())


def _found(split: Split, first: _Run, run: _Run, k: int) -> Found:
    op = split.op or split.other
    assert op is not None  # (a split has an op on one side at least)
    phase = "forward" if op.index < (first.forward if split.op else run.forward) else "backward"
    measured = split.kind in ("op", "generator") and split.op and split.other
    ours = first.outputs[split.op.index] if measured and split.op else None
    theirs = run.outputs[split.other.index] if measured and split.other else None
    # located() speaks of a training step; here the recording is one call of fn.
    named = dataclasses.replace(split, op=split.op and dataclasses.replace(split.op, phase=phase),
                                other=split.other and dataclasses.replace(split.other,
                                                                          phase=phase))
    detail = located(named, within="call", runs=("run 1", f"run {k}"))
    return Found(split.kind, op.module or None, op.op, phase, ours, theirs, detail, f"run {k}")


# -- between devices ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Call:
    name: str
    args: Any  # on the reference device, as the call received them
    kwargs: Any
    output: Any  # on the CPU
    rng: Any  # the RNG state the call started from


def between_devices(fn: Callable[..., Any], inputs: Sequence[Any],
                    devices: tuple[torch.device, torch.device], labels: tuple[str, str],
                    differs: Differs, rng: Rng) -> tuple[Found | None, str]:
    """Run ``fn`` on the reference device (``devices[0]``) and then each module call on the
    other from the reference's inputs and RNG state; the first module and op out of
    tolerance, or None, and what was compared. A function that is no module is one call."""
    ours = _copy(fn, devices[0])
    theirs = _copy(fn, devices[1])
    with torch.no_grad():
        calls = _calls(ours, _to(tuple(inputs), devices[0]), rng[0])
        mine, other = _modules(ours), _modules(theirs)
        for call in calls:
            rng[1](call.rng)
            try:
                out = on_cpu(other[call.name](*_to(call.args, devices[1]),
                                              **_to(call.kwargs, devices[1])))
            except Exception as err:
                err.add_note(
                    f"devrng.testing.locate_divergence: {call.name} failed on {labels[1]}, fed "
                    f"{labels[0]}'s inputs moved there. Each device runs its own copy of the "
                    "module; a function's closures are not moved: pass the module as fn.")
                raise
            if differs(out, call.output):
                return _in_module(call, out, (mine[call.name], other[call.name]), devices,
                                  labels, differs, rng[1]), _checked(calls, labels)
    return None, _checked(calls, labels)


def _checked(calls: list[_Call], labels: tuple[str, str]) -> str:
    return (f"{labels[1]} against {labels[0]}, module by module ({len(calls)} call"
            f"{'s' if len(calls) != 1 else ''}, each fed {labels[0]}'s inputs), forward")


def _copy(fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    return copy.deepcopy(fn).to(device) if isinstance(fn, torch.nn.Module) else fn


def _to(value: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t,
                    value)


def _modules(fn: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    if not isinstance(fn, torch.nn.Module):
        return {_name(fn): fn}
    return {(name or _name(fn)): module for name, module in fn.named_modules()}


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _calls(fn: Callable[..., Any], inputs: tuple[Any, ...],
           state: Callable[[], Any]) -> list[_Call]:
    """Run ``fn`` once, keeping every module call in the order the calls ended."""
    if not isinstance(fn, torch.nn.Module):
        rng = state()
        return [_Call(_name(fn), inputs, {}, on_cpu(fn(*inputs)), rng)]
    names = {id(module): name for name, module in _modules(fn).items()}
    entered: list[tuple[Any, Any, Any]] = []
    calls: list[_Call] = []

    def enter(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        # (copies taken before an in-place op writes to them)
        entered.append((*tree_map(_kept, (args, kwargs)), state()))

    def leave(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        args, kwargs, rng = entered.pop()
        calls.append(_Call(names[id(module)], args, kwargs, on_cpu(output), rng))

    handles = []
    for module in fn.modules():
        handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(module.register_forward_hook(leave, with_kwargs=True))
    try:
        fn(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _kept(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _in_module(call: _Call, out: Any, modules: tuple[Callable[..., Any], Callable[..., Any]],
               devices: tuple[torch.device, torch.device], labels: tuple[str, str],
               differs: Differs, restore: Callable[[Any], None]) -> Found:
    """The first op of ``call`` whose output leaves tolerance, each device running the
    module from the same inputs and RNG state with every op recorded."""
    recorded = []
    for module, device in zip(modules, devices, strict=True):
        args, kwargs = _to(call.args, device), _to(call.kwargs, device)
        restore(call.rng)
        with Ops(keep=True) as ops:
            module(*args, **kwargs)
        recorded.append(ops)
    a, b = recorded
    fed = f"Located: module {call.name}'s output on {labels[1]} leaves tolerance, and every module " \
          "call that ended before it stayed within"
    # The devices may run other ops for the same call (a backend's own decomposition):
    # compare the ops both ran, in order.
    matcher = difflib.SequenceMatcher(None, [op.op for op in a.ops], [op.op for op in b.ops],
                                      autojunk=False)
    for block in matcher.get_matching_blocks():
        for i, j in zip(range(block.a, block.a + block.size),
                        range(block.b, block.b + block.size), strict=True):
            if a.ops[i].op.split("::")[-1] in UNINITIALISED:  # (bytes that mean nothing)
                continue
            if differs(b.outputs[j], a.outputs[i]):
                op = a.ops[i]
                return Found("op", call.name, op.op, "forward", a.outputs[i], b.outputs[j], (
                    f"{fed}; within it, op {op.op} (op {i + 1} of its forward) "
                    f"is the first whose output leaves tolerance: {_device_hint(op, labels)}"),
                    labels[1])
    return Found("module", call.name, None, "forward", call.output, out, (
        f"{fed}; no single op of its forward left tolerance on its own (the small "
        "differences of several ops add up, or the ops ran inside one compiled graph)"),
        labels[1])


def _device_hint(op: Op, labels: tuple[str, str]) -> str:
    namespace = op.op.partition("::")[0]
    if namespace not in ("aten", "prims"):
        return (f"it is a custom op ({namespace}) whose kernel for {labels[1]} computes "
                f"otherwise than its kernel for {labels[0]}: compare the two kernels")
    return (f"{labels[1]}'s kernel for it computes otherwise than {labels[0]}'s (precision, "
            "a fused or approximate kernel): check its dtype and the backend's precision "
            "settings, or widen the tolerance if the difference is expected")

