"""The one door from the tests into devrng's private modules.

Tests check behaviour through devrng's public names (docs/API: ``devrng.*``, ``devrng.testing``,
``devrng.distributed``, ``devrng.integrations.*``, the ``devrng`` command). A few tests are
white-box on purpose; what they reach inside devrng is listed here once, each with why.
tests/test_layering.py checks that no other test file names a private devrng module.

Every entry loads on first use (as ``devrng``'s own face does), so importing this module, which
``tests/_fakes.py`` and so every test session does, imports nothing of devrng's, and a child
process can import it before it decides what to load.
"""

from __future__ import annotations

import importlib
from typing import Any

# Module paths for code that names a module rather than importing it (sys.modules keys).
# A child stands in for an install without the C kernel by blocking its import.
KERNEL_MODULE = "devrng._portable._threefry_kernel"
# A child, maybe with only an installed devrng on its path, asks the loader about the kernel.
KERNEL_LOADER = "devrng._portable.threefry_cpu"
# seeded_jit loads one module per compiler from here; a test drops them to re-import.
COMPILERS_PACKAGE = "devrng._jit.compilers"

_KERNEL_TABLES = ("BITS", "EXPONENTIAL", "KNOWN_COUNT", "KNOWN_DIGESTS", "KNOWN_START", "NORMAL",
                  "NORMAL_AT", "UNIFORM", "UNIFORM64", "UNIFORM_AT", "WORDS", "kernel", "status")

# name -> (module, attribute; None for the module itself)
_PRIVATE: dict[str, tuple[str, str | None]] = {
    # Backends a test registered are removed after it: the API has no unregister.
    "unregister_backend": ("devrng._backends.registry", "unregister_backend"),
    # Every registered name, lazy entries included (available_backends lists usable ones).
    "registry": ("devrng._backends.registry", "registry"),
    # The class of the torch.<type> modules patch_torch installs, and which types it owns.
    "DeviceRNGModule": ("devrng._backends.device_modules", "DeviceRNGModule"),
    "registered_device_types": ("devrng._backends.device_modules", "registered_types"),
    # Fault injection: the CPU/NumPy setters are made to fail where devrng calls them.
    "host": ("devrng._backends.host", None),
    "fork_module": ("devrng._generators.fork", None),
    # Device inference's per-type indices (infer_device_types returns only the types).
    "collect_devices": ("devrng._generators.infer", "collect_devices"),
    # seeded_jit's seed stream and backend choice, checked against their definitions.
    "nth_seed": ("devrng._base.seeds", "nth_seed"),
    "auto_compiler": ("devrng._jit.seeded", "auto_compiler"),
    # The real-SIGINT harness installs devrng's handler over Python's own in a child.
    "sigint": ("devrng._base.sigint", None),
    # DevRNGWarning's one raising function, checked for its logger copy and stack level.
    "warn_and_log": ("devrng._base.errors", "warn_and_log"),
    # Every setting deterministic() touches, read to check that it restores all of them.
    "current_settings": ("devrng._training.determinism", "current_settings"),
    # Worker seeds over workers x epochs x ranks, and the worker_init_fn's own type.
    "worker_seeds": ("devrng._training.workers", "worker_seeds"),
    "WorkerSeeding": ("devrng._training.workers", "WorkerSeeding"),
    # What a checkpoint records of a loader, compared field by field.
    "describe_loader": ("devrng._training.loaders", "describe"),
    # Threefry internals: known-answer vectors (Random123, JAX) and the stream's pieces.
    "threefry": ("devrng._portable.threefry", None),
    # The table of random aten ops portable covers, checked against torch's own list.
    "PORTABLE_OPS": ("devrng._portable.ops", "ENTRIES"),
    # The array functions torchax's bounded uniforms run in (imports JAX and torchax).
    "JAX_OPS": ("devrng._portable.jax", "JAX_OPS"),
    # The one XLA node that computes Threefry (imports torch_xla).
    "xla_bits": ("devrng._portable.threefry_xla", "xla_bits"),
    # DTensor counter math and a placement no CPU mesh can build (Partial).
    "shard_counters": ("devrng._portable.dtensor", "shard_counters"),
    "check_placements": ("devrng._portable.dtensor", "check_placements"),
    # A damaged C kernel build is put first on the package's __path__ in a child.
    "portable_package": ("devrng._portable", None),
    # The C kernel's known-answer tables, its loader and doctor's sentence about it.
    **{name: ("devrng._portable.threefry_cpu", name) for name in _KERNEL_TABLES},
    # doctor's rules, checked against made-up versions and environments.
    "environment_problems": ("devrng._cli", "environment_problems"),
    "known_problems": ("devrng._cli", "known_problems"),
    "why_not_imported": ("devrng._cli", "why_not_imported"),
    # The state every trainer integration checkpoints, fed bad entries without a trainer.
    "PerRankState": ("devrng.integrations._per_rank", "PerRankState"),
    # How devrng reads a module another thread may still be importing, tried on a module
    # held half imported.
    "imported": ("devrng._base.lazy", "imported"),
    # The version tables, checked against pyproject.toml and made-up versions.
    "MIN_TORCH": ("devrng._versions", "MIN_TORCH"),
    "TESTED_TORCH": ("devrng._versions", "TESTED_TORCH"),
    "version_problems": ("devrng._versions", "version_problems"),
}


def __getattr__(name: str) -> Any:
    target = _PRIVATE.get(name)
    if target is None:
        raise AttributeError(f"module 'tests._internals' has no attribute {name!r}")
    module = importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value
