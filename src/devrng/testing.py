"""Consistency checks: is a function reproducible, does a device agree with the CPU?

Every check returns (or raises with) a ``Report``, whose text reads like
``9 / 7680 mismatched (0.1%), max abs 1.8e-04, max rel 2.7e-01, MAE 3.1e-06``
with one line per tensor for nested outputs. Tolerances default to
``torch.testing.assert_close``'s per-dtype defaults.

Examples:
    >>> import torch
    >>> from devrng.testing import compare
    >>> print(compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1])))
    1 / 2 mismatched (50.0%), max abs 1.0e-01, max rel 4.8e-02, MAE 5.0e-02 (float32 (2,), rtol 1.3e-06, atol 1.0e-05)
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.testing._comparison import default_tolerances

from devrng._backends.registry import current_accelerator, default_types, loaded_backend
from devrng._base.errors import check_flags, short_repr
from devrng._base.lazy import load
from devrng._base.seeds import check_seed
from devrng._checks.locate import Found, between_devices, between_runs
from devrng._generators.infer import arg_devices
from devrng._generators.saved import describe
from devrng._generators.seeding import manual_seed
from devrng._generators.snapshot import RNGState, get_rng_state, set_rng_state

__all__ = [
    "Divergence",
    "LeafReport",
    "Report",
    "assert_reproducible",
    "compare",
    "compare_devices",
    "compare_grad_modes",
    "locate_divergence",
]

# Python numbers compare as the dtypes torch.testing gives them.
_NUMBER_DTYPES: dict[type, torch.dtype] = {
    bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128,
}
# Same-size integer views, to compare floating-point tensors bit for bit.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MAX_LINES = 20


# -- the report -------------------------------------------------------------
@dataclass(frozen=True)
class LeafReport:
    """How one tensor of an output compares with its reference.

    ``max_rel`` is relative to the reference (the second argument of
    ``compare``); it is ``inf`` where the reference is 0 and the values differ.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    mismatched: int
    max_abs: float
    max_rel: float
    mae: float
    rtol: float
    atol: float
    bitwise_equal: bool
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Every element within tolerance, and no shape or dtype mismatch."""
        return self.problem is None and self.mismatched == 0

    def summary(self) -> str:
        """The figures as one line: ``"9 / 7680 mismatched (0.1%), max abs ..."``."""
        return _summary(self.numel, self.mismatched, self.max_abs, self.max_rel, self.mae)


@dataclass(frozen=True)
class Report:
    """The result of a comparison: one ``LeafReport`` per tensor, plus problems.

    ``str(report)`` is a one-line summary (and a line per tensor for nested
    outputs); ``report.ok`` says whether everything is within tolerance;
    ``report.assert_ok()`` raises ``AssertionError`` with the text otherwise.

    Examples:
        >>> report = devrng.testing.compare(torch.ones(3), torch.ones(3))
        >>> print(report)
        0 / 3 mismatched (0.0%), max abs 0.0e+00, max rel 0.0e+00, MAE 0.0e+00 (float32 (3,), rtol 1.3e-06, atol 1.0e-05)
        >>> report.ok, report.bitwise_equal
        (True, True)
    """

    leaves: tuple[LeafReport, ...]
    problems: tuple[str, ...] = ()
    title: str = ""

    @property
    def numel(self) -> int:
        """Elements compared, over every tensor."""
        return sum(leaf.numel for leaf in self.leaves)

    @property
    def mismatched(self) -> int:
        """Elements outside tolerance, over every tensor."""
        return sum(leaf.mismatched for leaf in self.leaves)

    @property
    def mismatch_ratio(self) -> float:
        """``mismatched / numel`` (0 when nothing was compared)."""
        return self.mismatched / self.numel if self.numel else 0.0

    @property
    def max_abs(self) -> float:
        """Largest absolute difference (``nan`` if a NaN meets a number)."""
        return _nanmax(leaf.max_abs for leaf in self.leaves)

    @property
    def max_rel(self) -> float:
        """Largest difference relative to the reference's magnitude."""
        return _nanmax(leaf.max_rel for leaf in self.leaves)

    @property
    def mae(self) -> float:
        """Mean absolute error over every element of every tensor."""
        total = sum(leaf.mae * leaf.numel for leaf in self.leaves if leaf.numel)
        return total / self.numel if self.numel else 0.0

    @property
    def ok(self) -> bool:
        """No structural problem and every element within tolerance."""
        return not self.problems and all(leaf.ok for leaf in self.leaves)

    @property
    def bitwise_equal(self) -> bool:
        """No structural problem and every tensor equal bit for bit."""
        return not self.problems and all(leaf.bitwise_equal for leaf in self.leaves)

    def __bool__(self) -> bool:
        return self.ok

    def assert_ok(self, msg: str | None = None) -> None:
        """Raise ``AssertionError`` with the report's text unless ``ok``.

        Examples:
            >>> compare(torch.ones(3), torch.ones(3)).assert_ok()   # passes
            >>> compare(torch.ones(3), torch.zeros(3)).assert_ok("model output")
            Traceback (most recent call last):
            ...
            AssertionError: model output
            3 / 3 mismatched (100.0%), max abs 1.0e+00, max rel inf, MAE 1.0e+00 (float32 (3,), rtol 1.3e-06, atol 1.0e-05)
        """
        if not self.ok:
            raise AssertionError(f"{msg}\n{self}" if msg else str(self))

    @property
    def structure_problems(self) -> tuple[str, ...]:
        """Differences that are not in the values: shapes, dtypes, missing keys, lengths."""
        return self.problems + tuple(f"{leaf.path}: {leaf.problem}" for leaf in self.leaves
                                     if leaf.problem is not None)

    def __str__(self) -> str:
        context = [self.title] if self.title else []
        if len(self.leaves) == 1 and not self.problems:
            leaf = self.leaves[0]
            context.append(_leaf_context(leaf))
        else:
            context.append(f"{len(self.leaves)} tensors")
        summary = _summary(self.numel, self.mismatched, self.max_abs, self.max_rel, self.mae)
        structural = self.structure_problems
        # A report that cannot compare everything must not open like a clean one.
        head = "" if not structural else (
            f"MISMATCH: {structural[0]}"
            + (f" (and {len(structural) - 1} more difference(s) in structure)"
               if len(structural) > 1 else "") + "; values: ")
        lines = [f"{head}{summary} ({'; '.join(context)})"]
        lines += [f"  {p}" for p in self.problems]
        if len(self.leaves) > 1 or self.problems:
            shown = list(self.leaves)
            if len(shown) > _MAX_LINES:
                shown = [leaf for leaf in shown if not leaf.ok][:_MAX_LINES]
            lines += [f"  {leaf.path}: {_leaf_line(leaf)}" for leaf in shown]
            hidden = len(self.leaves) - len(shown)
            if hidden:
                lines.append(f"  ... and {hidden} more tensors (see report.leaves)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = str(self).splitlines()[0]
        return f"<Report ok={self.ok}: {first}>"


def _summary(numel: int, mismatched: int, max_abs: float, max_rel: float, mae: float) -> str:
    return (f"{mismatched} / {numel} mismatched ({_percent(mismatched, numel)}), "
            f"max abs {_num(max_abs)}, max rel {_num(max_rel)}, MAE {_num(mae)}")


def _leaf_line(leaf: LeafReport) -> str:
    if leaf.problem is not None and not leaf.numel:  # nothing was compared
        return leaf.problem
    return f"{leaf.summary()} ({_leaf_context(leaf)})"


def _leaf_context(leaf: LeafReport) -> str:
    if leaf.problem is not None:
        return leaf.problem
    return f"{leaf.dtype} {leaf.shape}, rtol {_num(leaf.rtol)}, atol {_num(leaf.atol)}"


def _percent(part: int, whole: int) -> str:
    if not whole or not part:
        return "0.0%"
    p = 100.0 * part / whole
    if p < 0.1:  # never print a real mismatch as 0.0%
        return f"{p:.1g}%"
    if part < whole and p > 99.9:
        return ">99.9%"
    return f"{p:.1f}%"


def _num(x: float) -> str:
    return f"{x:.1e}" if math.isfinite(x) else str(x)


def _nanmax(values: Iterator[float] | Sequence[float]) -> float:
    out = 0.0
    for v in values:
        if math.isnan(v):
            return math.nan
        out = max(out, v)
    return out


# -- comparing --------------------------------------------------------------
def compare(a: Any, b: Any, *, rtol: float | None = None, atol: float | None = None,
            equal_nan: bool = True, title: str = "") -> Report:
    """Compare ``a`` with the reference ``b``, tensor by tensor.

    ``a`` and ``b`` are tensors, numbers or any nesting of lists, tuples and
    dicts of them. Tensors are compared on the CPU; an element mismatches
    when ``|a - b| > atol + rtol * |b|``. Without ``rtol`` / ``atol`` the
    defaults of ``torch.testing.assert_close`` for the dtypes apply (float32:
    rtol 1.3e-6, atol 1e-5; integers and bool: exact).

    Args:
        a: The output to check.
        b: The reference.
        rtol: Relative tolerance; give both ``rtol`` and ``atol`` or neither.
        atol: Absolute tolerance.
        equal_nan: NaNs in the same place agree.
        title: What is compared, shown in the report (``"xla:0 vs cpu"``).

    Returns:
        A ``Report``: ``report.ok``, the figures, and a line per tensor.

    Raises:
        ValueError: Only one of ``rtol`` / ``atol`` is given.

    Examples:
        >>> a = torch.tensor([1.0, 2.0]); b = torch.tensor([1.0, 2.1])
        >>> print(devrng.testing.compare(a, b))
        1 / 2 mismatched (50.0%), max abs 1.0e-01, max rel 4.8e-02, MAE 5.0e-02 (float32 (2,), rtol 1.3e-06, atol 1.0e-05)
    """
    if (rtol is None) != (atol is None):
        raise ValueError(
            f"rtol={rtol!r} and atol={atol!r}: give both tolerances or neither (neither uses "
            "torch.testing's defaults for the dtypes)."
        )
    leaves: list[LeafReport] = []
    problems: list[str] = []
    _walk(a, b, "output", leaves, problems, rtol, atol, equal_nan)
    return Report(tuple(leaves), tuple(problems), title)


def _walk(a: Any, b: Any, path: str, leaves: list[LeafReport], problems: list[str],
          rtol: float | None, atol: float | None, equal_nan: bool) -> None:
    ta, tb = _as_tensor(a), _as_tensor(b)
    if ta is not None and tb is not None:
        leaves.append(_compare_tensors(ta, tb, path, rtol, atol, equal_nan))
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in a:
            if key in b:
                _walk(a[key], b[key], f"{path}[{key!r}]", leaves, problems, rtol, atol, equal_nan)
            else:
                problems.append(f"{path}[{key!r}]: only in the compared output, not the reference")
        problems.extend(f"{path}[{key!r}]: only in the reference, not the compared output"
                        for key in b if key not in a)
    elif _is_sequence(a) and _is_sequence(b):
        if len(a) != len(b):
            problems.append(f"{path}: {len(a)} items vs {len(b)} in the reference")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _walk(x, y, f"{path}[{i}]", leaves, problems, rtol, atol, equal_nan)
    elif ta is not None or tb is not None or type(a) is not type(b):
        problems.append(f"{path}: {describe(a)} vs {describe(b)} in the reference")
    else:
        try:
            same = bool(a == b)
        except Exception:
            same = a is b
        if not same:
            problems.append(f"{path}: {short_repr(a, 40)} vs {short_repr(b, 40)} in the reference")


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _as_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    dtype = _NUMBER_DTYPES.get(type(x))
    if dtype is not None:
        return torch.tensor(x, dtype=dtype)
    if type(x).__module__ == "numpy" and hasattr(x, "dtype") and x.dtype.kind in "biufc":
        return torch.as_tensor(x)
    return None


def _compare_tensors(a: torch.Tensor, b: torch.Tensor, path: str, rtol: float | None,
                     atol: float | None, equal_nan: bool) -> LeafReport:
    a = a.detach().to("cpu")
    b = b.detach().to("cpu")
    if rtol is None or atol is None:
        rtol, atol = default_tolerances(a, b)
    dtype = str(a.dtype).removeprefix("torch.")
    if a.dtype != b.dtype:
        dtype += f" vs {str(b.dtype).removeprefix('torch.')}"
    shape = tuple(a.shape)
    if a.shape != b.shape:
        return LeafReport(path, shape, dtype, 0, 0, 0.0, 0.0, 0.0, rtol, atol,
                          False, f"shape {shape} vs {tuple(b.shape)} in the reference")
    bitwise = a.dtype == b.dtype and _bitwise_equal(a, b)
    numel = a.numel()
    if numel == 0:
        return LeafReport(path, shape, dtype, 0, 0, 0.0, 0.0, 0.0, rtol, atol, bitwise,
                          None if a.dtype == b.dtype else f"dtype {dtype}")
    # Statistics in double precision, so that they do not round away the
    # differences they measure.
    common = torch.promote_types(a.dtype, b.dtype)
    work = torch.complex128 if common.is_complex else torch.float64
    x, y = a.to(work), b.to(work)
    agree = x == y  # covers equal infinities, whose difference is nan
    if equal_nan:
        agree |= torch.isnan(x) & torch.isnan(y)
    diff = torch.where(agree, torch.zeros((), dtype=torch.float64), (x - y).abs())
    scale = y.abs()
    rel = torch.where(diff == 0, torch.zeros((), dtype=torch.float64), diff / scale)
    close = agree | (diff <= atol + rtol * scale)
    mismatched = numel - int(close.sum())
    return LeafReport(
        path, shape, dtype, numel, mismatched,
        float(diff.max()), float(rel.max()), float(diff.mean()), rtol, atol, bitwise,
        None if a.dtype == b.dtype else f"dtype {dtype}",
    )


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_complex():
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


# -- running functions ------------------------------------------------------
def _types_of(*objs: Any) -> list[str]:
    """Device types of the tensors and modules in ``objs`` and of every device in use."""
    found = list(arg_devices(objs).indices)
    return found + [t for t in default_types() if t not in found]


@contextlib.contextmanager
def _forked(types: list[str]) -> Iterator[RNGState]:
    """Fork every device of ``types``, the CPU, Python and NumPy; yield the saved state.

    Like fork_rng, without its warning about forking every device of a type:
    covering them all is the point here.
    """
    state = get_rng_state(device_type=types)
    try:
        yield state
    finally:
        set_rng_state(state)


def _to_cpu(out: Any) -> Any:
    """``out`` with every tensor detached and copied to the CPU (a copy: later runs may mutate it)."""
    if isinstance(out, torch.Tensor):
        return out.detach().to("cpu", copy=True)
    if isinstance(out, Mapping):
        return {k: _to_cpu(v) for k, v in out.items()}
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # namedtuple
        return type(out)(*(_to_cpu(v) for v in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_to_cpu(v) for v in out)
    return out


def assert_reproducible(fn: Callable[..., Any], *args: Any, seed: int = 0, runs: int = 2,
                        **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` ``runs`` times from the same seed; raise unless all bitwise equal.

    Before each run devrng seeds torch's CPU generator, the generators of
    every device type the arguments live on or that is in use, Python's
    ``random`` and NumPy's global generator. The caller's RNG state is
    restored afterwards.

    Args:
        fn: The function to run.
        *args: Its positional arguments (also where devices are looked for).
        seed: The seed every run starts from.
        runs: How many runs to compare, at least 2.
        **kwargs: Its keyword arguments.

    Raises:
        AssertionError: A run differs from the first; the message holds the
            ``Report`` of the first run that differs and a checklist of where
            unseeded randomness comes from.
        ValueError: ``runs`` is less than 2, or ``seed`` is out of range.

    Examples:
        >>> devrng.testing.assert_reproducible(torch.nn.functional.dropout, torch.ones(8))
        >>> import time
        >>> devrng.testing.assert_reproducible(lambda: torch.tensor(time.perf_counter_ns()))
        Traceback (most recent call last):
        ...
        AssertionError: <lambda> is not reproducible: run 2 of 2 from seed=0 differs from run 1...
    """
    seed = check_seed(seed)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs={runs!r} must be an int of at least 2: the runs are compared "
                         "with each other.")
    types = _types_of(fn, args, kwargs)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    with _forked(types):
        # A run may bring up a device the arguments did not name (a tensor
        # created inside fn): then seed that type too and start again.
        for _ in range(4):
            outputs = []
            for _run in range(runs):
                manual_seed(seed, device_type=types)
                outputs.append(_to_cpu(fn(*args, **kwargs)))
            new = [t for t in _types_of(outputs) if t not in types]
            if not new:
                break
            types += new
    for i, out in enumerate(outputs[1:], start=2):
        report = compare(out, outputs[0], rtol=0.0, atol=0.0, title=f"run {i} vs run 1")
        if not report.bitwise_equal:
            raise AssertionError(
                f"{name} is not reproducible: run {i} of {runs} from seed={seed} differs from "
                f"run 1.\n{report}\nIts randomness does not all come from the generators devrng "
                "seeds (torch's CPU and device generators, Python's random, NumPy's global "
                "generator): look for a torch.Generator or NumPy Generator seeded elsewhere, "
                "os.urandom or time-based seeds, or nondeterministic kernels "
                "(see devrng.deterministic())."
            )


def _move(obj: Any, device: torch.device) -> Any:
    """A copy of ``obj`` on ``device``: tensors moved, modules deep-copied then moved."""
    if isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to(device)
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device).requires_grad_(obj.requires_grad)
    if isinstance(obj, Mapping):
        return {k: _move(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_move(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device) for v in obj)
    return obj


def compare_devices(fn: Callable[..., Any], inputs: Any,
                    devices: Sequence[str | torch.device] | None = None, *, seed: int = 0,
                    rtol: float | None = None, atol: float | None = None,
                    portable: bool = False) -> Report:
    """Run ``fn`` on each device from the same seed and inputs; compare with the first device.

    ``devices=None`` compares XLA (when this process has imported torch_xla),
    else the current accelerator, with the CPU; without either it says that
    there is nothing to compare with (torchax tensors: pass the devices).

    ``inputs`` is moved to each device (a tuple is unpacked as positional
    arguments, anything else is passed as the one argument). If ``fn`` is an
    ``nn.Module``, each device runs its own deep copy, so all start from the
    same weights. Before each run devrng seeds that device and the CPU with
    ``seed``; the caller's RNG state is restored afterwards. Devices draw
    different random numbers from the same seed, so compare functions without
    randomness (e.g. a model in ``eval()`` mode), or pass ``portable=True``:
    then each device runs inside ``devrng.portable(seed)``, and dropout,
    ``rand`` and the other covered ops draw the same numbers on every device.

    Args:
        fn: A function or an ``nn.Module``.
        inputs: The argument, or a tuple of positional arguments.
        devices: Devices to run on, the first being the reference;
            ``None`` is the CPU and XLA (when in use) or the accelerator.
        seed: The seed every device starts from.
        rtol: Relative tolerance; give both or neither.
        atol: Absolute tolerance.
        portable: Run each device inside ``devrng.portable(seed)``.

    Returns:
        A ``Report`` of every other device against the first.

    Raises:
        ValueError: With ``devices=None``, there is no device to compare the
            CPU with; an entry of ``devices`` is not a device; or only one of
            ``rtol`` / ``atol`` is given.

    Examples:
        >>> model = torch.nn.Conv2d(3, 8, 3).eval()
        >>> print(compare_devices(model, torch.randn(2, 3, 16, 16), devices=("cpu", "cpu")))
        0 / 3136 mismatched (0.0%), max abs 0.0e+00, max rel 0.0e+00, MAE 0.0e+00 (cpu vs cpu; ...)
        >>> import torch_xla
        >>> report = compare_devices(model, torch.randn(2, 3, 16, 16))   # XLA vs the CPU
        >>> report.ok
        True
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
        >>> compare_devices(net, torch.randn(4, 8), portable=True).ok   # same dropout masks
        True
    """
    seed = check_seed(seed)
    check_flags(portable=portable)
    if devices is None:
        devices = _default_devices()
    if isinstance(devices, (str, torch.device)) or len(devices) < 2:
        raise ValueError(
            f"devices={devices!r} must name at least two devices, the reference first, as in "
            "devices=('cpu', 'xla:0')."
        )
    parsed = []
    for d in devices:
        try:
            parsed.append(torch.device(d))
        except (RuntimeError, ValueError, TypeError) as err:
            raise ValueError(f"{d!r} in devices is not a device; use strings such as 'cpu', "
                             "'cuda:0' or 'xla:0', or torch.device objects.") from err
    # Labels as the caller wrote them; "cpu" twice is allowed (a sanity check).
    labels = [str(d) for d in devices]
    accel = [d for d in parsed if d.type not in ("cpu", "meta")]
    outputs = []
    # manual_seed reaches every device of a type, so fork them all.
    with _forked(list(dict.fromkeys(d.type for d in accel))):
        for device in parsed:
            f = _move(fn, device) if isinstance(fn, torch.nn.Module) else fn
            moved = _move(inputs, device)
            manual_seed(seed, devices=[device] if device.type != "cpu" else [])
            stream = _portable_stream(seed) if portable else contextlib.nullcontext()
            try:
                with stream:
                    out = f(*moved) if isinstance(moved, tuple) else f(moved)
            except Exception as err:
                err.add_note(
                    f"devrng.testing.compare_devices: this failed on {device}. fn receives "
                    "the inputs moved to each device; a module that fn uses must be moved "
                    "too: pass it as fn or inside inputs, not through a closure."
                )
                raise
            outputs.append(_to_cpu(out))
    if len(parsed) == 2:
        return compare(outputs[1], outputs[0], rtol=rtol, atol=atol,
                       title=f"{labels[1]} vs {labels[0]}")
    leaves: list[LeafReport] = []
    problems: list[str] = []
    for label, out in zip(labels[1:], outputs[1:], strict=True):
        sub = compare(out, outputs[0], rtol=rtol, atol=atol)
        leaves += [_relabel(leaf, label) for leaf in sub.leaves]
        problems += [f"{label} {p}" for p in sub.problems]
    return Report(tuple(leaves), tuple(problems), f"{', '.join(labels[1:])} vs {labels[0]}")


def _portable_stream(seed: int) -> Any:
    return load("devrng._portable.rng:portable", what="compare_devices(portable=True)")(seed)


def _default_devices() -> tuple[str, str]:
    """The CPU and the device this process computes on, or an error saying there is none."""
    xla = loaded_backend("xla")  # only if the program imported torch_xla
    other = "xla:0" if xla is not None and xla.is_available() else current_accelerator()
    if other == "jax":  # torchax's device: tensors move there only inside its environment
        other = None
    if other is None:
        raise ValueError(
            "compare_devices has nothing to compare with: this process has no accelerator and "
            "has not imported torch_xla. Pass devices=('cpu', 'xla:0') (after import "
            "torch_xla) or another device to compare the CPU with."
        )
    return ("cpu", other)


def _relabel(leaf: LeafReport, label: str) -> LeafReport:
    return LeafReport(**{**leaf.__dict__, "path": f"{label} {leaf.path}"})


def compare_grad_modes(module: Callable[..., Any], *inputs: Any, rtol: float | None = None,
                       atol: float | None = None) -> Report:
    """Output with autograd on vs under ``torch.no_grad()``, from the same RNG state.

    A healthy backend agrees to rounding error. Buffers that the first run
    changes (BatchNorm statistics in training mode) are put back before the
    second run and afterwards, and the caller's RNG state is restored.

    Args:
        module: A module (or function) to run twice.
        *inputs: Its arguments.
        rtol: Relative tolerance; give both or neither.
        atol: Absolute tolerance.

    Returns:
        A ``Report`` of the ``no_grad`` output against the autograd one.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).train()
        >>> print(devrng.testing.compare_grad_modes(net, torch.randn(4, 8)))
        0 / 32 mismatched (0.0%), max abs 0.0e+00, max rel 0.0e+00, MAE 0.0e+00 (no_grad vs grad; ...)
    """
    types = _types_of(module, inputs)
    buffers = _buffers(module)
    with _forked(types) as state:
        with torch.enable_grad():
            with_grad = _to_cpu(module(*inputs))
        _restore_buffers(buffers)
        set_rng_state(state)
        with torch.no_grad():
            without = _to_cpu(module(*inputs))
        _restore_buffers(buffers)
    return compare(without, with_grad, rtol=rtol, atol=atol, title="no_grad vs grad")


def _buffers(module: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if not isinstance(module, torch.nn.Module):
        return []
    return [(b, b.detach().clone()) for b in module.buffers()]


def _restore_buffers(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for buf, copy_ in saved:
            buf.copy_(copy_)


# -- locating a divergence --------------------------------------------------------------
@dataclass(frozen=True)
class Divergence:
    """Where two runs (or two devices) of a function first part, from ``locate_divergence``.

    ``module`` is the qualified name of the module (None: none, or no difference),
    ``op`` the op's name (``"aten::index_add_"``, ``"mylib::fused_attn"``), ``phase``
    ``"forward"`` or ``"backward"``, ``kind`` how they part (``"op"``: equal inputs and
    other outputs; ``"generator"``: a random op drew from a generator in another state;
    ``"input"``, ``"path"``, ``"module"``, ``"output"``: see ``str()``), and ``report``
    the figures of the first differing output against the reference's (a ``Report``;
    None when there is nothing to measure). ``str()`` says it in one paragraph.
    """

    ok: bool
    module: str | None
    op: str | None
    phase: str | None
    kind: str | None
    report: Report | None
    compared: str
    detail: str

    @property
    def mismatched(self) -> int:
        """Elements of the first differing output outside tolerance (0 when ok)."""
        return self.report.mismatched if self.report is not None else 0

    @property
    def max_abs(self) -> float:
        """Largest absolute difference there (0.0 when ok)."""
        return self.report.max_abs if self.report is not None else 0.0

    @property
    def max_rel(self) -> float:
        """Largest relative difference there (0.0 when ok)."""
        return self.report.max_rel if self.report is not None else 0.0

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"No divergence: {self.compared}: {self.detail}."
        figures = f" The outputs there: {str(self.report).splitlines()[0]}." \
            if self.report is not None else ""
        return f"Divergence: {self.compared}. {self.detail}.{figures}"


def locate_divergence(fn: Callable[..., Any], *inputs: Any,
                      devices: Sequence[str | torch.device] | None = None, runs: int = 2,
                      rtol: float | None = None, atol: float | None = None) -> Divergence:
    """Name the first module and op where runs of ``fn(*inputs)`` part.

    With ``devices=None`` it runs ``fn`` (a module or a function) ``runs`` times on the
    same inputs (a fresh copy of each tensor per run), each from the same RNG state and buffers (the caller's RNG state and
    the module's buffers are restored afterwards),
    forward and -- when an output requires grad -- backward from a gradient of ones,
    with every op recorded; the first op whose inputs are equal and whose outputs are not
    is named, with its module and the fix where one is known. Runs must agree bit for
    bit; ``rtol`` / ``atol`` only set what the figures count as mismatched.

    With ``devices=(reference, other)`` it runs ``fn`` on the reference device keeping
    every module call's inputs and output, then each module (its children before it) on
    the other device from the reference's inputs, so that error does not pile up
    through the layers: the first module whose output leaves tolerance (``compare``'s
    defaults unless given) is named, and within it the first op. Forward only; a
    function that is no module is one call. Each device runs a deep copy of a module,
    each module call from the RNG state the reference's call started from (devices of
    one type draw the same; a CPU and an XLA device do not: use ``eval()``).

    Args:
        fn: A module or a function.
        *inputs: Its positional arguments.
        devices: None (runs on one device), or two devices, the reference first.
        runs: How many runs to compare with ``devices=None``, at least 2.
        rtol: Relative tolerance; give both or neither.
        atol: Absolute tolerance.

    Returns:
        A ``Divergence``: ``.ok``, ``.module``, ``.op``, ``.phase``, the figures.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``runs`` is less than 2; ``devices`` is not two devices or names one
            this process cannot use; only one of ``rtol`` / ``atol`` is given.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
        >>> print(devrng.testing.locate_divergence(net, torch.ones(2, 4)))
        No divergence: 2 runs of Sequential on cpu, forward (6 ops) and backward (8 ops): they matched bit for bit.
        >>> import time
        >>> def noisy(x):   # a generator seeded from the clock, which devrng does not seed
        ...     clock = torch.Generator().manual_seed(time.perf_counter_ns())
        ...     return x + torch.rand(x.shape, generator=clock)
        >>> found = devrng.testing.locate_divergence(noisy, torch.ones(2, 4))
        >>> found.ok, found.module, found.op, found.phase, found.kind
        (False, None, 'aten::rand', 'forward', 'generator')
    """
    if not callable(fn):
        raise TypeError(f"fn={short_repr(fn)} is not callable: pass a module or a function "
                        "to run.")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs={runs!r} must be an int of at least 2: the runs are compared "
                         "with each other.")
    compare(0.0, 0.0, rtol=rtol, atol=atol)  # (raises for half a tolerance)
    if devices is None:
        exact = (0.0, 0.0) if rtol is None or atol is None else (rtol, atol)
        buffers = _buffers(fn)  # (BatchNorm's statistics: each run starts from them)
        with _forked(_types_of(fn, inputs)) as state:
            def reset() -> None:
                set_rng_state(state)
                _restore_buffers(buffers)

            try:
                found, compared = between_runs(
                    fn, inputs, runs, reset,
                    lambda a, b: not compare(a, b, rtol=0.0, atol=0.0).bitwise_equal)
            finally:
                _restore_buffers(buffers)
        return _divergence(found, compared, "they matched bit for bit", exact, "run 1")
    pair, labels = _two_devices(devices)
    accel = list(dict.fromkeys(d.type for d in pair if d.type != "cpu"))
    with _forked(accel):
        found, compared = between_devices(
            fn, inputs, pair, labels, lambda a, b: not compare(a, b, rtol=rtol, atol=atol).ok,
            (lambda: get_rng_state(device_type=accel), set_rng_state))
    return _divergence(found, compared, "every module's output stayed within tolerance",
                       (rtol, atol), labels[0])


def _divergence(found: Found | None, compared: str, fine: str,
                tolerance: tuple[float | None, float | None], ours: str) -> Divergence:
    if found is None:
        return Divergence(True, None, None, None, None, None, compared, fine)
    report = None if found.ours is None or found.theirs is None else compare(
        found.theirs, found.ours, rtol=tolerance[0], atol=tolerance[1],
        title=f"{found.other} vs {ours}")
    return Divergence(False, found.module, found.op, found.phase, found.kind, report,
                      compared, found.detail)


def _two_devices(devices: Any) -> tuple[tuple[torch.device, torch.device], tuple[str, str]]:
    """``devices`` as two usable devices and their labels, or a ValueError saying why not."""
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence) \
            or len(devices) != 2:
        raise ValueError(f"devices={devices!r} must name two devices, the reference first, as "
                         "in devices=('cpu', 'xla:0'), or be None to compare runs on one "
                         "device.")
    parsed = []
    for d in devices:
        try:
            device = torch.device(d)
            torch.empty(0, device=device)
        except (RuntimeError, ValueError, TypeError, AssertionError) as err:
            raise ValueError(f"{d!r} in devices is not a device this process can use ({err}); "
                             "use strings such as 'cpu', 'cuda:0' or 'xla:0' (after import "
                             "torch_xla).") from err
        parsed.append(device)
    return (parsed[0], parsed[1]), (str(devices[0]), str(devices[1]))
