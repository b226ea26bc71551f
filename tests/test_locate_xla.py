"""devrng.testing.locate_divergence on a real XLA device (torch_xla on PJRT CPU): a module
whose op computes otherwise on XLA is located module by module, fed the CPU's inputs; a
model equal on both devices passes; runs on XLA are located as on the CPU.

These run in the xla environment (PJRT_DEVICE=CPU); the core environment skips them.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from tests._nondeterministic import Pool, batch, model

from devrng.testing import locate_divergence

torch_xla = pytest.importorskip("torch_xla")
pytestmark = pytest.mark.xla
XLA = torch_xla.device()


@torch.library.custom_op("devrng_test::shifted", mutates_args=())
def shifted(x: torch.Tensor) -> torch.Tensor:
    """``2 * x``; its XLA kernel (below) adds an offset: a real op with a kernel per device."""
    return x * 2


@shifted.register_kernel("xla")
def _(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 0.5


class Shift(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted(x) + 1


def test_the_op_that_computes_otherwise_on_xla_is_located_to_its_module() -> None:
    net = torch.nn.Sequential(OrderedDict(
        embed=torch.nn.Linear(8, 8), act=torch.nn.ReLU(),
        block=torch.nn.Sequential(OrderedDict(shift=Shift(), norm=torch.nn.LayerNorm(8))),
        head=torch.nn.Linear(8, 2))).eval()
    found = locate_divergence(net, torch.randn(4, 8), devices=("cpu", "xla:0"))
    assert (found.ok, found.module, found.op, found.phase, found.kind) == (
        False, "block.shift", "devrng_test::shifted", "forward", "op")
    assert found.max_abs == pytest.approx(0.5) and found.mismatched == 32
    text = str(found)
    assert "module block.shift's output on xla:0 leaves tolerance" in text
    assert "kernel for xla:0 computes otherwise" in text


def test_a_model_equal_on_both_devices_passes() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                              torch.nn.Linear(16, 2)).eval()
    found = locate_divergence(net, torch.randn(4, 8), devices=("cpu", "xla:0"))
    assert found.ok, str(found)
    assert "xla:0 against cpu, module by module (5 calls" in str(found)


def test_runs_on_xla_are_located_as_on_the_cpu() -> None:
    found = locate_divergence(model(Pool()).to(XLA), batch().to(XLA), runs=3)
    assert (found.ok, found.module, found.op, found.phase) == (
        False, "pool", "devrng_test::unordered_sum", "forward")
    assert "on xla" in str(found)
    assert locate_divergence(torch.nn.Linear(8, 2).to(XLA), torch.randn(4, 8).to(XLA)).ok


class ThroughNumPy(torch.nn.Module):
    """A layer computed in NumPy: it runs on the CPU only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2)


def test_a_module_that_fails_on_the_other_device_is_named() -> None:
    net = torch.nn.Sequential(OrderedDict(embed=torch.nn.Linear(8, 8), numpy=ThroughNumPy()))
    with pytest.raises(TypeError) as raised:
        locate_divergence(net.eval(), torch.randn(4, 8), devices=("cpu", "xla:0"))
    assert "numpy failed on xla:0, fed cpu's inputs" in "\n".join(raised.value.__notes__)
