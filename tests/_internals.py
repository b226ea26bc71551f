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
# The kernel's torch-free proof, run as `python -m` in children (cibuildwheel's test command).
KERNEL_PROOF = "devrng._portable.kernel_proof"
# Where pyproject.toml reads the version from (its dynamic `attr`).
VERSION_ATTR = "devrng._base.version.VERSION"
# Children under other CPython releases import devrng's bytecode readers without torch.
BYTECODE_MODULE = "devrng._base.bytecode"
SIGINT_MODULE = "devrng._base.sigint"

_KERNEL_TABLES = ("sorts_stably", "BITS", "EXPONENTIAL", "NORMAL", "NORMAL_AT", "PROOF_DIGEST", "PROOF_FILLS",
                  "PROOF_KEY", "PROOF_LENGTH", "PROOF_RANDINTS", "PROOF_SPLIT", "UNIFORM",
                  "UNIFORM64", "UNIFORM_AT", "WORDS", "jax_multiplier", "proof_counters",
                  "proof_digest", "proof_draw_counters", "UNIFORM64_AT", "UNIT_F16", "UNIT_BF16",
                  "UNIFORM_F16_AT", "UNIFORM_BF16_AT", "NORMAL_F16", "NORMAL_BF16",
                  "NORMAL_F16_AT", "NORMAL_BF16_AT")

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
    # How long a stream fork waits for another thread's before it warns (shortened in tests).
    "streams_module": ("devrng._generators.streams", None),
    # Device inference's per-type indices (infer_device_types returns only the types).
    "collect_devices": ("devrng._generators.infer", "collect_devices"),
    # seeded_jit's seed stream and backend choice, checked against their definitions.
    "nth_seed": ("devrng._base.seeds", "nth_seed"),
    "auto_compiler": ("devrng._jit.seeded", "auto_compiler"),
    # The real-SIGINT harness installs devrng's handler over Python's own in a child.
    "sigint": ("devrng._base.sigint", None),
    # The CPython releases devrng's bytecode readings are tested on, emptied to see the
    # fallback of an untested one.
    "bytecode": ("devrng._base.bytecode", None),
    # DevRNGWarning's one raising function, checked for its logger copy and stack level.
    "warn_and_log": ("devrng._base.errors", "warn_and_log"),
    # Every setting deterministic() touches, read to check that it restores all of them.
    "current_settings": ("devrng._training.determinism", "current_settings"),
    # Worker seeds over workers x epochs x ranks, and the worker_init_fn's own type.
    "worker_seeds": ("devrng._base.seeds", "worker_seeds"),
    "WorkerSeeding": ("devrng._training.workers", "WorkerSeeding"),
    # What a checkpoint records of a loader, compared field by field.
    "describe_loader": ("devrng._training.loaders", "describe"),
    # The flight record's digests and fingerprints, checked on their own (exact, ordered,
    # sampled as the docs say); its file read back; the words for a difference; its module
    # for the file size that prunes and a line's checksum (a record edited as another run's).
    "batch_digest": ("devrng._checks.digest", "batch_digest"),
    "indices_digest": ("devrng._checks.digest", "indices_digest"),
    "generator_fingerprint": ("devrng._checks.digest", "generator_fingerprint"),
    "numpy_fingerprint": ("devrng._checks.digest", "numpy_fingerprint"),
    "python_fingerprint": ("devrng._checks.digest", "python_fingerprint"),
    "digest_module": ("devrng._checks.digest", None),
    "read_record": ("devrng._checks.compare", "read_record"),
    "explain": ("devrng._checks.verdict", "explain"),
    "flight_module": ("devrng._checks.record", None),
    "compare_module": ("devrng._checks.compare", None),
    # check-resume's comparison of three runs' records and its could-not-check error, fed
    # synthetic records (a case no real script reaches cheaply: nothing after the checkpoint).
    "compare_runs": ("devrng._checks.check_resume", "_compare"),
    "determinism_verdict": ("devrng._checks.check_determinism", "_verdict"),
    # Its locating runs, with the runs and their op recordings made up (which rank's pair
    # parts in which attempt cannot be chosen in a real job).
    "determinism_module": ("devrng._checks.check_determinism", None),
    "ops_module": ("devrng._checks.ops", None),
    "CouldNotCheck": ("devrng._checks.runs", "CheckFailed"),
    # Threefry internals: known-answer vectors (Random123, JAX) and the stream's pieces.
    "threefry": ("devrng._portable.threefry", None),
    "distributions": ("devrng._portable.distributions", None),
    # The device table: a CPU row without float64 stands in for MPS and torchax (SIMULATED).
    "portable_devices": ("devrng._portable.devices", None),
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
    **{name: ("devrng._portable.kernel_proof", name) for name in _KERNEL_TABLES},
    "PARALLEL_FROM": ("devrng._portable.threefry_cpu", "PARALLEL_FROM"),
    "DTYPES": ("devrng._portable.threefry_cpu", "DTYPES"),
    "CpuKernel": ("devrng._portable.threefry_cpu", "CpuKernel"),
    "kernel": ("devrng._portable.threefry_cpu", "kernel"),
    "status": ("devrng._portable.threefry_cpu", "status"),
    "switched_off": ("devrng._portable.threefry_cpu", "switched_off"),
    # The loader's checks, run on bit-flipped builds of the kernel (tests/_kernel_flips.py).
    "load_checked": ("devrng._portable.threefry_cpu", "load_checked"),
    # doctor's rules, checked against made-up versions and environments.
    "environment_problems": ("devrng._cli", "environment_problems"),
    "known_problems": ("devrng._cli", "known_problems"),
    "why_not_imported": ("devrng._cli", "why_not_imported"),
    # The state every trainer integration checkpoints, fed bad entries without a trainer.
    "PerRankState": ("devrng.integrations._per_rank", "PerRankState"),
    # A test changes one piece of a saved state, then seals it again (as devrng would have
    # written it) to reach the check behind the digest (tests._helpers.resealed).
    "seal": ("devrng._generators.saved", "seal"),
    # The one formatter of values in messages, fed values no state should hold.
    "short_repr": ("devrng._base.errors", "short_repr"),
    # How devrng reads a module another thread may still be importing, tried on a module
    # held half imported.
    "imported": ("devrng._base.lazy", "imported"),
    # Whether the command a check launches can import devrng, asked of made-up interpreters
    # (check-resume asks it before its first run).
    "devrng_missing": ("devrng._base.commands", "devrng_missing"),
    "devrng_missing_in_output": ("devrng._base.commands", "devrng_missing_in_output"),
    # The version tables, checked against pyproject.toml and made-up versions.
    "MIN_TORCH": ("devrng._versions", "MIN_TORCH"),
    "TESTED_TORCH": ("devrng._versions", "TESTED_TORCH"),
    "version_problems": ("devrng._versions", "version_problems"),
}


# The fixes of issue 37's resume cases, each with a switch (module, attribute) that turns it
# off: a test runs a case without devrng's own fix to show what the run does then (what the
# flight record must catch). Set in a child before it trains: ``set_fix(name, False)``.
FIXES: dict[str, tuple[str, str]] = {
    # workers report draws outside sample_rng (dataset, collate_fn); a resume inside an epoch
    # warns of them, and another number of workers counts only them
    "WORKER_DRAWS": ("devrng._training.loaders", "_FIX_WORKER_DRAWS"),
    # samplers torchdata replays (Subset/WeightedRandomSampler, RandomSampler(replacement))
    # replay from the generators of the epoch's start
    "REPLAYED_SAMPLERS": ("devrng._training.loaders", "_FIX_REPLAYED_SAMPLERS"),
    # a place saved inside an epoch is fitted to another number of workers, or refused in a
    # sentence (TrainingRNG)
    "WORKER_COUNT": ("devrng._training.loaders", "_FIX_WORKER_COUNT"),
    # the same refusal under Lightning, before its teardown error hides torchdata's assertion
    "LIGHTNING_WORKER_COUNT": ("devrng.integrations.lightning", "_FIX_WORKER_COUNT"),
    # the warning for workers kept across epochs names the order of the samples too
    "PERSISTENT_ORDER": ("devrng._training.loaders", "_FIX_PERSISTENT_ORDER"),
    # a resumed StatefulDataLoader makes its iterator when the loop asks for it (after the
    # loop's set_epoch), not inside load_state_dict (issue 44)
    "LATE_RESUME": ("devrng._training.loaders", "_FIX_LATE_RESUME"),
    # a sampler torchdata replays draws, each time torchdata calls iter() on it or takes its
    # first index while making the resumed iterator, from the generators the uninterrupted
    # run's did (issue 44)
    "SAMPLER_DRAWS": ("devrng._training.loaders", "_FIX_SAMPLER_DRAWS"),
    # HF Trainer: ignore_data_skip=True resumed inside an epoch warns
    "IGNORE_DATA_SKIP": ("devrng.integrations.transformers", "_FIX_IGNORE_DATA_SKIP"),
}


def set_fix(name: str, on: bool) -> None:
    """Turn devrng's fix ``name`` (a key of ``FIXES``) on or off in this process."""
    module, attribute = FIXES[name]
    setattr(importlib.import_module(module), attribute, on)


def __getattr__(name: str) -> Any:
    target = _PRIVATE.get(name)
    if target is None:
        raise AttributeError(f"module 'tests._internals' has no attribute {name!r}")
    module = importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value
