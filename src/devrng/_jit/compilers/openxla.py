"""``backend="openxla"``: ``torch.compile(backend="openxla")`` with a reproducible first call.

The stock openxla backend builds its XLA graph lazily, on the first run of
each AOT graph, by executing the graph once as lazy tensors; every random op
in it advances the device's running seed. The compiled graph then runs with
the advanced seed, so the first call differs from every later call with the
same seed. Here the graph is built by devrng's own forward/backward compiler,
which puts the XLA seeds back after building it, so the first run reads the
seed it was given. Later runs read the seed from the device at run time (the
bridge feeds it as graph input), so a new seed never recompiles.

A graph whose ops are all views (the ``return loss.detach()`` that dynamo
compiles on its own after the graph break at ``loss.backward()``) makes no XLA
computation, and torch_xla 2.9's bridge then fails looking it up ("Check failed:
cachedComputation"; plain ``torch.compile(backend="openxla")`` too). Such a graph
draws nothing and computes nothing: it runs as it is, on lazy tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func  # type: ignore[attr-defined]

from devrng._backends.xla import get_seed, set_seed
from devrng._jit.compilers.runner import SeededRunner
from devrng._jit.compilers.torch_xla import xla_devices, xla_runner

__all__ = ["make_runner", "seeded_openxla"]


def _only_views(model: torch.fx.GraphModule) -> bool:
    """Whether every op of ``model`` is a view (detach, alias, reshape...) of its inputs."""
    return all(node.op != "call_function" or getattr(node.target, "is_view", False)
               for node in model.graph.nodes)


def _graph_compiler(model: torch.fx.GraphModule, fake_inputs: list[Any]) -> Callable[..., Any]:
    if _only_views(model):
        return make_boxed_func(model)
    compiled: Callable[..., Any] | None = None

    def run(*args: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            import torch_xla.core.dynamo_bridge as bridge

            saved = [(d, int(get_seed(d))) for d in xla_devices(args)]
            try:
                compiled = bridge.extract_compiled_graph(model, args)
            finally:
                # Building the graph ran it once and advanced the seeds: undo that.
                for d, state in saved:
                    set_seed(state, d)
        return compiled(*args)

    return make_boxed_func(run)


#: A dynamo backend: openxla whose first run is reproducible from the seed.
seeded_openxla = aot_autograd(fw_compiler=_graph_compiler)


def _key_device(inputs: Any) -> torch.device:
    # The XLA graph must take a portable stream's key as an input tensor on its device.
    return torch.device(xla_devices(inputs)[0])


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> SeededRunner:
    return xla_runner(torch.compile(fn, backend=seeded_openxla, **compile_kwargs),
                      key_device=_key_device)
