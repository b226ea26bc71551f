"""Recording every op a stretch of a run executes, with the module it ran in, and finding the
first op where two recordings part: the level below a step.

``Ops`` is a torch dispatch mode (``torch.utils._python_dispatch.TorchDispatchMode``)
with global module hooks: for each op it keeps the op's name (``aten::index_add_``, or
the namespace of a ``torch.library`` op), the innermost module it ran in (its qualified
name in the model that module belongs to), the phase (forward, backward, optimizer, or
other), and exact digests of its inputs (taken before it runs: an in-place op changes
them) and outputs. In the backward pass an op is credited to the module whose forward
made the autograd node being run (``torch._C._current_autograd_node``).

``first_split`` walks two recordings of the same stretch in order: the first op whose
inputs are equal in both and whose outputs are not is where they part. Ops inside a
compiled graph (``torch.compile``, ``seeded_jit``) are not seen one by one: the graph
is one op, or its module is the finest answer.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["Op", "Ops", "Split", "first_split", "on_cpu", "read_ops", "write_ops"]


@dataclass(frozen=True)
class Op:
    """One op as recorded: its name, module, phase, and its inputs' and outputs' digests."""

    index: int
    op: str
    module: str
    phase: str
    ins: str
    outs: str
    device: str = "cpu"
    rng: str = ""  # the digest of the generator state a random op drew from ("": none)


@dataclass(frozen=True)
class Split:
    """Where two recordings part: ``kind`` is ``"op"`` (equal inputs, other outputs: the op
    itself), ``"generator"`` (a random op whose generator was in other states),  ``"input"`` (an op's inputs differ though every op before it matched: the
    difference came from outside the recorded ops) or ``"path"`` (the runs ran other ops
    from here). ``op`` is the first run's op there (None: its recording ended)."""

    kind: str
    op: Op | None
    other: Op | None


#: Ops whose outputs are draws: equal inputs and other outputs mean another generator state.
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "cauchy_", "dropout", "exponential_", "feature_dropout",
    "geometric_", "log_normal_", "multinomial", "native_dropout", "normal", "normal_",
    "poisson", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "random_", "randperm", "rrelu_with_noise", "uniform_", "_fused_dropout",
})


#: Factories whose output is a constant of their arguments (no draw, no memory left as is).
CONSTANT = frozenset({"zeros", "ones", "full", "arange", "linspace", "logspace", "eye",
                      "scalar_tensor", "zeros_like", "ones_like", "full_like", "new_zeros",
                      "new_ones", "new_full"})


class Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Record the ops run while active (``with Ops() as ops: ...``; then ``ops.ops``).

    With ``keep=True`` it also keeps a CPU copy of every op's outputs (``ops.outputs``,
    one entry per op in ``ops.ops``), to measure how far two recordings' outputs part.

    Examples:
        >>> from devrng._checks.ops import Ops
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> x = torch.ones(1, 2)
        >>> with Ops() as ops:
        ...     _ = model(x)
        >>> sorted({(op.module, op.phase) for op in ops.ops})
        [('0', 'forward'), ('1', 'forward')]
    """

    def __init__(self, models: Sequence[torch.nn.Module] = (), *, keep: bool = False) -> None:
        """``models``: name their modules from them (a module otherwise takes its name from
        the first module whose forward runs around it: a trainer may call a submodule's)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[Op] = []
        self.outputs: list[Any] = []  # with keep: each op's outputs, on the CPU
        self._keep = keep
        self._stack: list[str] = []
        self._names: dict[int, str] = {}  # id(module) -> qualified name in its model
        self._roots: list[torch.nn.Module] = []  # (kept: ids stay theirs)
        # Which module's forward made the autograd nodes numbered below each mark.
        self._made: list[int] = []
        self._made_in: list[str] = []
        self._optimizer = 0
        self.paused = 0  # inside aside(): ops are devrng's own, not recorded
        # Storages handed out and not written yet, by address; weakly referenced: an address
        # freed and handed out again (by an op, or by another thread) is new memory.
        self._fresh: dict[int, StorageWeakRef] = {}
        self._handles: list[Any] = []
        for model in models:
            self.name_modules(model)

    def __enter__(self) -> Ops:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._enter_module),
            hooks.register_module_forward_hook(self._leave_module),
            register_optimizer_step_pre_hook(self._enter_optimizer),
            register_optimizer_step_post_hook(self._leave_optimizer),
        ]
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Ops run inside are devrng's own (the flight record's digests): not recorded."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def _made_by_node(self, node: Any) -> str:
        """The module whose forward made autograd node ``node`` ("" when none did)."""
        try:
            number = node._sequence_nr()
        except Exception:
            return ""
        at = bisect.bisect_right(self._made, number)
        return self._made_in[at] if at < len(self._made) else ""

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        name = self._names.get(id(module))
        if name is None:  # a model seen for the first time: name its modules from it
            self.name_modules(module, keep=True)
            name = self._names[id(module)]
        self._stack.append(name)

    def name_modules(self, model: torch.nn.Module, keep: bool = False) -> None:
        """Name ``model``'s modules by their qualified names in it (``keep``: not those
        named already)."""
        self._roots.append(model)
        for sub_name, sub in model.named_modules():
            if not (keep and id(sub) in self._names):
                self._names[id(sub)] = sub_name or type(model).__name__

    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _enter_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer += 1

    def _leave_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer = max(0, self._optimizer - 1)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name if hasattr(func, "_schema") else str(func)
        base = name.split("::")[-1]  # (the schema's name holds no overload)
        # devrng's own work (the flight record's digests), and record_function's marks (no
        # computation), are not recorded.
        if self.paused or name.startswith("profiler::"):
            return func(*args, **kwargs)
        ins = self._digest((args, _read(func, kwargs)))
        rng = _generator_digest(base, args, kwargs)
        result = func(*args, **kwargs)
        if name.startswith("c10d::"):  # a collective's outputs are its result once it ends
            for leaf in tree_flatten(result)[0]:
                if callable(getattr(leaf, "wait", None)):
                    leaf.wait()
        self._written(func, base, args, kwargs, result)
        node = torch._C._current_autograd_node()
        if node is not None:
            phase, module = "backward", self._made_by_node(node)
        elif self._stack:
            phase, module = "forward", self._stack[-1]
        else:
            phase, module = ("optimizer" if self._optimizer else "other"), ""
        # A constant factory's output is a function of its arguments: they are its digest
        # (its bytes are not read back).
        outs = ins if base in CONSTANT else self._digest(result)
        if phase == "forward":
            # The autograd node of this op (made before it reached this mode) has the
            # sequence number before the one the thread hands out next.
            made = torch._C._autograd._get_sequence_nr()
            if not self._made or self._made[-1] != made:
                self._made.append(made)
                self._made_in.append(module)
        if self._keep:
            self.outputs.append(on_cpu(result))
        self.ops.append(Op(len(self.ops), name, module, phase, ins, outs, _device(args), rng))
        return result

    def _written(self, func: Any, base: str, args: Any, kwargs: Any, result: Any) -> None:
        """Keep track of memory whose bytes mean nothing yet (``torch.empty``'s): it is
        digested as uninitialised until an op writes to it."""
        if base in UNINITIALISED:
            for t in tree_flatten(result)[0]:
                if isinstance(t, torch.Tensor):
                    self._fresh[_storage(t)] = _weak(t)
            return
        if not self._fresh:
            return
        schema = func._schema
        values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
        for argument, value in zip(schema.arguments, values, strict=False):
            if argument.alias_info is not None and argument.alias_info.is_write:
                for t in tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor):
                        self._fresh.pop(_storage(t), None)

    def _unwritten(self, t: torch.Tensor) -> bool:
        ref = self._fresh.get(_storage(t))
        if ref is not None and ref.expired():  # type: ignore[no-untyped-call]
            # Freed: another tensor's memory is at that address now.
            del self._fresh[_storage(t)]
            return False
        return ref is not None

    def _digest(self, value: Any) -> str:
        """An exact digest of every tensor's bytes in ``value`` (with its dtype and shape),
        and of the other arguments' text; memory no op wrote yet counts by its shape only."""
        h = hashlib.blake2b(digest_size=8)
        for leaf in tree_flatten(value)[0]:
            if isinstance(leaf, torch.Tensor):
                fresh = bool(self._fresh) and self._unwritten(leaf)
                h.update(_tensor_bytes(leaf, fresh))
            elif not isinstance(leaf, torch.Generator):  # (its state: Op.rng)
                h.update(_ADDRESS.sub("", repr(leaf)).encode()[:200])
            h.update(b"|")
        return h.hexdigest()


#: Ops that hand out memory without writing it: their bytes differ from run to run.
UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                            "new_empty_strided", "empty_permuted", "_empty_affine_quantized"})


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _read(func: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments an op reads: not its ``out=`` ones, whose bytes it overwrites
    (a buffer reused from run to run, as DDP's gradient buckets, holds other bytes)."""
    outs = {a.name for a in func._schema.arguments if a.is_out}
    return {k: v for k, v in kwargs.items() if k not in outs} if outs else kwargs


def _generator_digest(base: str, args: Any, kwargs: Any) -> str:
    """The state of the generator a random op draws from: its ``generator=`` argument's, or
    the CPU's default generator for a CPU op without one ("" for other ops)."""
    if base not in RANDOM_OPS:
        return ""
    found = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Generator)]
    try:
        if found:
            state = found[0].get_state()
        elif _device(args) == "cpu":
            state = torch.default_generator.get_state()
        else:
            return ""
        return hashlib.blake2b(state.numpy().tobytes(), digest_size=8).hexdigest()
    except Exception:  # a generator whose state cannot be read here
        return ""


def on_cpu(value: Any) -> Any:
    """``value`` with every tensor detached and copied to the CPU (a copy: later ops may
    write to the original)."""
    return tree_map(lambda t: t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor)
                    else t, value)


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # (a tensor without storage)
        return -1


def _weak(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call]


def _device(args: Any) -> str:
    for t in tree_flatten(args)[0]:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cpu"


def _tensor_bytes(t: torch.Tensor, fresh: bool = False) -> bytes:
    head = f"{t.dtype}{tuple(t.shape)}".encode()
    if fresh:
        return head + b"uninitialised"
    if t.device.type == "xla":
        head += _xla_graph(t)
    try:
        data = t.detach()
        if data.layout != torch.strided or data.is_quantized:
            data = data.to_dense() if data.layout != torch.strided else data.dequantize()
        data = data.cpu().contiguous().reshape(-1)
        if data.is_complex():
            data = torch.view_as_real(data).reshape(-1)
        return head + data.view(torch.uint8).numpy().tobytes()
    except Exception:  # a tensor kind whose bytes cannot be read (meta, a subclass): its header
        return head


def _xla_graph(t: torch.Tensor) -> bytes:
    """The hash of the graph XLA traced for ``t``: a step's graph is compiled whole, so an op
    that traced another graph (another order of adds) counts as another output even where
    its values, run op by op, happen to match."""
    try:
        import torch_xla

        return bytes(torch_xla._XLAC._get_graph_hash([t]))
    except Exception:  # (torch_xla without it)
        return b""


def first_split(ours: Sequence[Op], theirs: Sequence[Op]) -> Split | None:
    """The first place two recordings of the same stretch part, or None when they match.

    Examples:
        >>> from devrng._checks.ops import Op, first_split
        >>> a = [Op(0, "aten::mm", "fc", "forward", "i1", "o1"),
        ...      Op(1, "aten::add", "fc", "forward", "i2", "o2")]
        >>> b = [a[0], Op(1, "aten::add", "fc", "forward", "i2", "o3")]
        >>> split = first_split(a, b)
        >>> split.kind, split.op.op
        ('op', 'aten::add')
    """
    for mine, other in zip(ours, theirs, strict=False):
        if (mine.op, mine.module, mine.phase) != (other.op, other.module, other.phase):
            return Split("path", mine, other)
        if mine.ins != other.ins:
            return Split("input", mine, other)
        if mine.rng != other.rng:
            return Split("generator", mine, other)
        if mine.outs != other.outs:
            return Split("op", mine, other)
    if len(ours) != len(theirs):
        n = min(len(ours), len(theirs))
        return Split("path", ours[n] if n < len(ours) else None,
                     theirs[n] if n < len(theirs) else None)
    return None


def write_ops(path: str, ops: Sequence[Op]) -> None:
    """Keep a recording in ``path`` (JSON lines)."""
    with open(path, "w") as fh:
        for op in ops:
            fh.write(json.dumps(asdict(op), separators=(",", ":")) + "\n")


def read_ops(path: str) -> list[Op]:
    """A recording ``write_ops`` kept."""
    with open(path) as fh:
        return [Op(**json.loads(line)) for line in _lines(fh)]


def _lines(fh: Any) -> Iterator[str]:
    for line in fh:
        if line.strip():
            yield line


def ops_path(directory: str, rank: int) -> str:
    """The file of rank ``rank``'s op recording in a record's ``directory``."""
    return os.path.join(directory, f"devrng-ops.rank{rank}.jsonl")
