"""The public surface and what `import devrng` loads."""

from __future__ import annotations

import subprocess
import sys

import devrng

HEAVY = ("torch_xla", "jax", "torchax", "intel_extension_for_pytorch")


def test_public_names_are_exactly_all() -> None:
    public = {n for n in dir(devrng) if not n.startswith("_")}
    assert public == set(devrng.__all__)


def test_all_lists_exactly_the_lazy_names() -> None:
    assert devrng.__all__ == sorted(devrng._LAZY)


def test_every_name_in_all_resolves() -> None:
    for name in devrng.__all__:
        assert getattr(devrng, name) is not None


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
