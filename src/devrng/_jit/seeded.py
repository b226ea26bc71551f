"""``seeded_jit``: compiled functions whose RNG seed is an explicit runtime argument.

Compilers get randomness wrong in three ways: the key is baked into the
program (torchax ``jax_jit``), the compiling call consumes RNG that later
calls do not (openxla), or the caller must remember to seed and restore the
right generators around every call. ``seeded_jit`` makes the seed an input
of the call with every compiler; the glue for each lives in
``devrng._jit.compilers.<name>``, imported only when that compiler is used.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

import torch

from devrng._backends.host import draw_seed
from devrng._base.errors import DevRNGError, short_repr
from devrng._base.lazy import imported, load
from devrng._base.seeds import MASK64, call_seed, check_counter, check_seed
from devrng._base.sigint import deliver, guard, interrupt_in, raised_count
from devrng._generators.saved import SEAL_KEYS, SavedForm, check_saved, refusing, seal
from devrng._jit.compilers.runner import MakeRunner, Runner, input_types

__all__ = ["COMPILER_NAMES", "SeededFunction", "auto_compiler", "seeded_jit"]

R = TypeVar("R")

#: Compiler name -> (module with make_runner, pip extra that installs it).
_COMPILERS: dict[str, tuple[str, str | None]] = {
    "eager": ("devrng._jit.compilers.eager", None),
    "inductor": ("devrng._jit.compilers.inductor", None),
    "torch_xla": ("devrng._jit.compilers.torch_xla", "xla"),
    "openxla": ("devrng._jit.compilers.openxla", "xla"),
    "torchax": ("devrng._jit.compilers.torchax", "torchax"),
}
#: What ``seeded_jit(backend=...)`` accepts (torch.compile's word for a compiler).
COMPILER_NAMES = (*_COMPILERS, "auto")

# 2: with a header and a digest; the bare dict (devrng <= 0.4) loads unchecked
_FORM = SavedForm("devrng.SeededFunction", (2,), 2, "SeededFunction.load_state_dict",
                  "SeededFunction.state_dict()")


def _active_portable() -> Any:
    """The active ``devrng.portable`` stream, if portable is in use at all in this process
    (a stream can be active only once its module is imported; ``imported`` waits for an
    import another thread has under way)."""
    module = imported("devrng._portable.rng")
    return None if module is None else module.active()


def _load_runner_factory(compiler: str) -> MakeRunner:
    module_name, extra = _COMPILERS[compiler]
    factory: MakeRunner = load(f"{module_name}:make_runner",
                               what=f"seeded_jit(backend={compiler!r})", extra=extra)
    return factory


def auto_compiler(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The compiler ``backend="auto"`` picks from a call's arguments: XLA tensors -> torch_xla,
    torchax tensors -> torchax, anything else -> inductor.

    Examples:
        >>> auto_compiler((torch.ones(2),), {})
        'inductor'
    """
    types = input_types((args, kwargs))
    if "xla" in types:
        return "torch_xla"
    if "jax" in types:
        return "torchax"
    return "inductor"


def _check_call_seed(seed: object) -> int | torch.Tensor:
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 0 or seed.dtype in (torch.bool,) or seed.dtype.is_floating_point \
                or seed.dtype.is_complex:
            raise TypeError(
                f"A seed tensor must be a 0-d integer tensor, not a {seed.dtype} tensor of shape "
                f"{tuple(seed.shape)}; pass e.g. torch.tensor(7) or an int in [0, 2**64)."
            )
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(
            f"seed must be None, an int in [0, 2**64) or a 0-d integer tensor, not "
            f"{short_repr(seed)} "
            f"(a {type(seed).__name__})."
        )
    return check_seed(seed)


def _own_seed_check(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature; refuse a function whose own ``seed`` parameter devrng's would hide."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return None
    param = sig.parameters.get("seed")
    if param is not None and param.kind is not inspect.Parameter.POSITIONAL_ONLY:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"seeded_jit cannot wrap {name}: it has a parameter named 'seed', which the "
            "result's own `seed=` keyword (the RNG seed of each call) would hide. Rename that "
            "parameter, or give it another name in a wrapper: seeded_jit(lambda *a, data_seed, "
            f"**k: {name}(*a, seed=data_seed, **k)), called as f(..., data_seed=..., seed=...)."
        )
    return sig


def _explain_positional_seed(sig: inspect.Signature | None, args: tuple[Any, ...],
                             kwargs: dict[str, Any], err: TypeError) -> None:
    """If a call failed because the seed was passed by position, say that it is keyword-only."""
    if sig is None or not args:
        return
    last = args[-1]
    looks_like_seed = (type(last) is int or (isinstance(last, torch.Tensor) and last.dim() == 0
                                             and not last.dtype.is_floating_point))
    if not looks_like_seed:
        return
    try:
        sig.bind(*args, **kwargs)
        return  # the arguments fit: the TypeError came from inside the function
    except TypeError:
        pass
    try:
        sig.bind(*args[:-1], **kwargs)
    except TypeError:
        return
    shown = short_repr(last)
    raise TypeError(
        f"The last positional argument, {shown}, looks like a seed, but seed is keyword-only: "
        f"call the function as f(..., seed={shown})."
    ) from err


class SeededFunction(Generic[R]):
    """What ``seeded_jit`` returns: call it as ``f(*args, seed=None, **kwargs)``.

    ``seed`` is an int in ``[0, 2**64)`` or a 0-d integer tensor; without it
    the call takes the next seed of the function's own stream. Equal seeds
    give bitwise-equal outputs, the first (compiling) call included, and the
    caller's RNG state is left as it was.

    Examples:
        >>> step = devrng.seeded_jit(lambda x: torch.nn.functional.dropout(x, 0.5),
        ...                          backend="eager", seed=0)
        >>> torch.equal(step(torch.ones(8), seed=7), step(torch.ones(8), seed=7))
        True
        >>> step.backend, step.compile_count   # eager compiles nothing
        ('eager', 0)
    """

    def __init__(self, fn: Callable[..., R], backend: str, seed: int | None,
                 compile_kwargs: dict[str, Any]) -> None:
        """Made by ``devrng.seeded_jit``, whose arguments these are."""
        if not callable(fn):
            raise TypeError(f"seeded_jit needs a callable to compile, not {fn!r}.")
        if backend not in COMPILER_NAMES:
            raise ValueError(
                f"seeded_jit got backend={backend!r}; accepted backends are "
                f"{', '.join(repr(b) for b in COMPILER_NAMES)}."
            )
        if seed is not None:
            seed = check_seed(seed, "seeded_jit's seed")
        self._signature = _own_seed_check(fn)
        self._fn = fn
        self._counter = 0
        self._compile_kwargs = dict(compile_kwargs)
        self._backend = backend
        self._runner: Runner | None = None
        if backend != "auto":
            # Build now, so a missing package or a bad compile option fails at wrap time.
            self._runner = _load_runner_factory(backend)(fn, self._compile_kwargs)
        if seed is None:
            # Drawn from torch's default generator once everything else succeeded (a wrap
            # that fails leaves the generator alone), so torch.manual_seed at program start
            # fixes every seeded function's stream too.
            seed = draw_seed()
        self._base_seed: int = seed
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]

    @property
    def backend(self) -> str:
        """The backend in use (``"auto"`` until the first call has chosen one)."""
        return self._backend

    @property
    def base_seed(self) -> int:
        """The base of this function's own seed stream (used by calls without ``seed=``)."""
        return self._base_seed

    @property
    def compile_count(self) -> int:
        """Compilations observed so far, as the compiler reports them (0 for eager)."""
        return 0 if self._runner is None else int(self._runner.compile_count)

    def __call__(self, *args: Any, seed: int | torch.Tensor | None = None, **kwargs: Any) -> R:
        if seed is None:
            value: int | torch.Tensor = call_seed(self._base_seed, self._counter)
            self._counter += 1
        elif type(seed) is int and 0 <= seed <= MASK64:
            value = seed  # the common case, checked without a call
        else:
            value = _check_call_seed(seed)
        runner = self._runner
        if runner is None:
            self._backend = auto_compiler(args, kwargs)
            runner = self._runner = _load_runner_factory(self._backend)(
                self._fn, self._compile_kwargs)
        stream = _active_portable()
        raised = raised_count()
        try:
            if stream is None:
                out: R = runner(value, args, kwargs)
            else:  # the call draws from the portable stream of its seed
                out = runner(value, args, kwargs, portable=stream.strict)
        except Exception as err:
            # A Ctrl-C that torch turned into another error: its C++ into a SystemError
            # (a callback's), dynamo's cleanup on torch 2.9 into an UnboundLocalError.
            interrupt = interrupt_in(err)
            if interrupt is not None:
                raise interrupt from None
            if isinstance(err, TypeError):
                _explain_positional_seed(self._signature, args, kwargs, err)
            raise
        if raised_count() != raised:  # a Ctrl-C taken inside, swallowed by the compiler's C++
            raise KeyboardInterrupt
        return out

    def state_dict(self) -> dict[str, Any]:
        """Base seed and call counter of the seed stream, for checkpoints.

        With a header: ``format``, ``version``, the devrng version, and a digest of it
        all that ``load_state_dict`` checks.

        Examples:
            >>> step = devrng.seeded_jit(lambda x: x, backend="eager", seed=3)
            >>> _ = step(torch.ones(1)); state = step.state_dict()
            >>> state["base_seed"], state["counter"]
            (3, 1)
        """
        return seal({"format": _FORM.tag, "version": _FORM.version, "base_seed": self._base_seed,
                     "counter": self._counter})

    @guard
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue the seed stream that ``SeededFunction.state_dict`` saved.

        Args:
            state_dict: What ``state_dict()`` returned, or ``{"base_seed": ...,
                "counter": ...}`` (unchecked, as devrng 0.4 saved it).

        Raises:
            DevRNGError: The keys are not those, a value is not an int in
                range, or the state was changed after it was saved (its digest).

        Examples:
            >>> step = devrng.seeded_jit(lambda x: x, backend="eager")
            >>> step.load_state_dict({"base_seed": 3, "counter": 1})
            >>> step.state_dict()["counter"]
            1
        """
        try:  # guarded: a Ctrl-C never leaves the seed stream half set
            with refusing("SeededFunction.load_state_dict"):
                base, counter = _parse_state(state_dict)
            self._base_seed = base
            self._counter = counter
        finally:
            deliver()

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        return (f"seeded_jit({name}, backend={self._backend!r}, base_seed={self._base_seed}, "
                f"counter={self._counter}, compile_count={self.compile_count})")


def _parse_state(state_dict: Any) -> tuple[int, int]:
    """Base seed and counter of a saved ``SeededFunction`` state, its digest checked if it
    has a header; or a ``DevRNGError`` sentence."""
    keys = set(state_dict) if isinstance(state_dict, Mapping) else None
    if keys is not None and "format" in keys:
        check_saved(state_dict, _FORM)
        keys -= {"format", "version", *SEAL_KEYS}
    if keys != {"base_seed", "counter"}:
        got = (f"a mapping with the keys {', '.join(sorted(map(short_repr, state_dict)))}"
               if isinstance(state_dict, Mapping) else f"a {type(state_dict).__name__}")
        raise DevRNGError(
            f"load_state_dict needs what SeededFunction.state_dict() returns, or a mapping "
            f"with exactly the keys 'base_seed' and 'counter', not {got}."
        )
    try:
        return (check_seed(state_dict["base_seed"], "state_dict['base_seed']"),
                check_counter(state_dict["counter"], "state_dict['counter']"))
    except (TypeError, ValueError) as err:
        raise DevRNGError(f"SeededFunction.load_state_dict: {err}") from None


@overload
def seeded_jit(fn: Callable[..., R], *, backend: str = "auto", seed: int | None = None,
               **compile_kwargs: Any) -> SeededFunction[R]: ...


@overload
def seeded_jit(fn: None = None, *, backend: str = "auto", seed: int | None = None,
               **compile_kwargs: Any) -> Callable[[Callable[..., R]], SeededFunction[R]]: ...


def seeded_jit(fn: Callable[..., R] | None = None, *, backend: str = "auto",
               seed: int | None = None, **compile_kwargs: Any
               ) -> SeededFunction[R] | Callable[[Callable[..., R]], SeededFunction[R]]:
    """Compile ``fn`` so that its random draws depend only on its inputs and a seed.

    Call the result as ``f(*args, seed=..., **kwargs)`` with an int in
    ``[0, 2**64)`` or a 0-d integer tensor. Without ``seed`` a call takes the
    next seed of the function's own stream. A new seed never recompiles, and
    the caller's RNG state is left as it was. Also a decorator:
    ``@seeded_jit`` or ``@seeded_jit(backend=...)``.

    Args:
        fn: The function to compile (a training step, a forward pass, ...).
        backend: ``"inductor"`` (``torch.compile``), ``"eager"`` (no
            compilation), ``"torch_xla"`` (``torch_xla.compile``),
            ``"openxla"`` (``torch.compile(backend="openxla")``), ``"torchax"``
            (JAX jit), or ``"auto"``: chosen from the devices of the first
            call's inputs (XLA: torch_xla, torchax: torchax, else inductor).
        seed: The base of the function's own seed stream; ``None`` draws it
            from torch's default generator now, so ``torch.manual_seed`` at
            program start fixes it.
        **compile_kwargs: Passed to the compiler (``mode``, ``fullgraph``,
            ``full_graph``, ``static_argnums``, ...).

    Returns:
        A ``SeededFunction`` (with ``fn=None``, a decorator that makes one).

    Raises:
        TypeError: ``fn`` is not callable or has a parameter named ``seed``,
            or ``seed`` is not an int.
        ValueError: ``backend`` is not one of the above, or ``seed`` is
            outside ``[0, 2**64)``.
        ImportError: The backend needs a package that is not installed.

    Examples:
        On the CPU (``"eager"`` runs ``fn`` as it is; ``"inductor"`` compiles
        it the same way):

        >>> @devrng.seeded_jit(backend="eager")
        ... def noisy(x):
        ...     return torch.nn.functional.dropout(x, 0.5)
        >>> x = torch.ones(16)
        >>> torch.equal(noisy(x, seed=1), noisy(x, seed=1))
        True
        >>> torch.equal(noisy(x, seed=1), noisy(x, seed=2))
        False

        On an XLA device (needs torch_xla):

        >>> import torch_xla
        >>> @devrng.seeded_jit(backend="torch_xla")
        ... def step(x):
        ...     return torch.nn.functional.dropout(x, 0.5)
        >>> x = torch.ones(16, device=torch_xla.device())
        >>> torch_xla.sync()   # inputs arrive materialised, as a DataLoader delivers them
        >>> torch.equal(step(x, seed=1).cpu(), step(x, seed=1).cpu())
        True
        >>> step.compile_count   # one compilation, whatever the seed
        1
    """
    if fn is None:
        def decorate(f: Callable[..., R]) -> SeededFunction[R]:
            return SeededFunction(f, backend, seed, compile_kwargs)

        return decorate
    return SeededFunction(fn, backend, seed, compile_kwargs)
