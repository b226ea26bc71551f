"""Gradient checkpointing on XLA with torch.utils.checkpoint, made correct by devrng.patch_torch().

Run (on any machine, XLA on the CPU):

    PJRT_DEVICE=CPU python examples/checkpointing_xla.py

It trains one step of a small model with dropout four ways from the same seed
and prints how far each step's gradients are from the plain (no
checkpointing) step:

1. torch.utils.checkpoint without devrng: the AttributeError users see;
2. a naive shim module lacking ``_initialized``: runs, wrong gradients;
3. with ``devrng.patch_torch()``: bitwise equal (reentrant and not);
4. torch_xla.utils.checkpoint, for reference.
"""

# requires: torch_xla
# timeout: 300

from __future__ import annotations

import sys
import types

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.utils.checkpoint as xla_checkpoint
from torch.utils.checkpoint import checkpoint

import devrng

SEED = 1234
dev = torch_xla.device()
gen = torch.Generator().manual_seed(0)
block = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 64)
)
with torch.no_grad():
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
block = block.to(dev)
x = torch.randn(32, 64, generator=gen).to(dev)
torch_xla.sync()


def step(mode: str) -> list[torch.Tensor]:
    """One forward + backward from SEED; the parameter gradients on the CPU."""
    for p in block.parameters():
        p.grad = None
    xm.set_rng_state(SEED, dev)
    inp = x.detach().requires_grad_()
    if mode == "plain":
        out = block(inp)
    elif mode == "torch_xla":
        out = xla_checkpoint.checkpoint(block, inp)
    else:
        out = checkpoint(block, inp, use_reentrant=(mode == "reentrant"))
    out.square().mean().backward()
    torch_xla.sync()
    return [p.grad.cpu() for p in block.parameters()]


def report(name: str, grads: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    diffs = [(g - r).abs() for g, r in zip(grads, ref, strict=True)]
    mismatched = sum(int((d != 0).sum()) for d in diffs)
    total = sum(d.numel() for d in diffs)
    worst = max(float(d.max()) for d in diffs)
    scale = max(float(r.abs().max()) for r in ref)
    equal = all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))
    print(f"{name:<34} bitwise equal: {equal!s:<5}  mismatched {mismatched}/{total}  "
          f"max abs diff {worst:.3e} (largest gradient {scale:.3e})")
    return equal


plain = step("plain")

# 1. What users see today.
try:
    step("non_reentrant")
except AttributeError as err:
    print(f"{'torch checkpoint, no devrng':<34} AttributeError: {err}")


# 2. A careless fix: a module with the seed but without `_initialized`.
class NaiveShim(types.ModuleType):
    def device_count(self) -> int:
        return 1

    def get_rng_state(self, device: object = None) -> torch.Tensor:
        return torch.tensor(xm.get_rng_state(), dtype=torch.int64)

    def set_rng_state(self, state: torch.Tensor, device: object = None) -> None:
        xm.set_rng_state(int(state))


torch._register_device_module("xla", NaiveShim("naive_shim"))
report("naive shim (no _initialized)", step("non_reentrant"), plain)
del torch.xla  # type: ignore[attr-defined]
sys.modules.pop("torch.xla", None)
torch.get_device_module.cache_clear()

# 3. The one-line fix.
devrng.patch_torch()
ok = report("patch_torch, use_reentrant=False", step("non_reentrant"), plain)
ok &= report("patch_torch, use_reentrant=True", step("reentrant"), plain)

# 4. torch_xla's own checkpoint, for reference.
ok &= report("torch_xla.utils.checkpoint", step("torch_xla"), plain)
devrng.unpatch_torch()
sys.exit(0 if ok else 1)
