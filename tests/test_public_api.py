"""The public surface and what `import devrng` loads."""

from __future__ import annotations

import logging

import pytest
from tests._helpers import run_python

import devrng

HEAVY = ("torch_xla", "jax", "torchax", "intel_extension_for_pytorch")


# The public surface of API.md: a name added or lost here is an API change.
PUBLIC = {
    "Backend", "DeterministicHandle", "DevRNGError", "DevRNGWarning", "FlightRecord",
    "PortableRNG", "RNGState",
    "RNGStreams", "SeededFunction", "TrainingRNG", "available_backends", "deterministic",
    "distributed", "fork_rng", "get_backend", "get_rng_state", "infer_device_types",
    "manual_seed", "patch_torch", "portable", "register_backend", "sample_rng", "seed_worker",
    "seeded_jit", "set_rng_state", "testing",
    "unpatch_torch",
}


def test_the_public_names_are_the_documented_ones_and_all_resolve() -> None:
    assert set(devrng.__all__) == PUBLIC
    assert {n for n in dir(devrng) if not n.startswith("_")} == PUBLIC
    for name in sorted(PUBLIC):
        assert getattr(devrng, name) is not None, name


def test_import_and_cpu_fork_load_nothing_heavy() -> None:
    code = (
        "import sys, torch, devrng\n"
        "with devrng.fork_rng(devices=[torch.ones(1)]):\n"
        "    torch.rand(1)\n"
        "with devrng.fork_rng():\n"
        "    pass\n"
        "devrng.manual_seed(1); devrng.get_rng_state(); devrng.available_backends()\n"
        "devrng.infer_device_types(['xla:0', 'cuda:1'])\n"
        "with devrng.portable(0):\n"
        "    torch.rand(2); torch.nn.functional.dropout(torch.ones(4), 0.5)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_devrng_warning_is_a_user_warning_also_logged_on_the_devrng_logger(
        caplog: pytest.LogCaptureFixture) -> None:
    from tests._internals import warn_and_log

    assert issubclass(devrng.DevRNGWarning, UserWarning)
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            pytest.warns(devrng.DevRNGWarning, match="^The run differs: because.$") as caught:
        warn_and_log("The run differs: because.")
    assert [r.getMessage() for r in caplog.records] == ["The run differs: because."]
    assert caught[0].filename == __file__  # reported where it was called from


def test_the_devrng_logger_prints_nothing_unless_configured() -> None:
    out = run_python("import warnings\n"
                     "from tests._internals import warn_and_log\n"
                     "warnings.simplefilter('ignore')\n"
                     "warn_and_log('x')\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no second copy through logging's last-resort handler
