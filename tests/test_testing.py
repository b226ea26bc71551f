"""devrng.testing: reports, reproducibility checks, device and grad-mode comparisons."""

from __future__ import annotations

import copy
import os
import random
import re
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.testing._comparison import default_tolerances

from devrng.testing import (
    Report,
    assert_reproducible,
    compare,
    compare_devices,
    compare_grad_modes,
)

SUMMARY = re.compile(
    r"^(?:MISMATCH: .*; values: )?(\d+) / (\d+) mismatched \((>?[\d.e-]+)%\), max abs (\S+), max rel (\S+), MAE (\S+) \((.*)\)$"
)


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).eval()


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + x)


class TinyResNet(nn.Module):
    """ResNet-style: stem, two residual blocks, pooling, dropout, classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.blocks = nn.Sequential(Block(16), Block(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                                  nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def parse(report: Report) -> tuple[int, int, float, float, float]:
    m = SUMMARY.match(str(report).splitlines()[0])
    assert m, f"unexpected report text: {report}"
    return int(m[1]), int(m[2]), float(m[4]), float(m[5]), float(m[6])


# -- compare / Report -------------------------------------------------------
def test_compare_counts_a_known_perturbation() -> None:
    a = torch.randn(60, 128)
    b = a.clone()
    flat = b.view(-1)
    idx = torch.randperm(flat.numel())[:9]
    flat[idx] += 1e-3
    report = compare(b, a)
    assert report.mismatched == 9
    assert report.numel == 7680
    assert report.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert report.mae == pytest.approx(9e-3 / 7680, rel=1e-3)
    expected_rel = ((b.double() - a.double()).abs() / a.double().abs()).max().item()
    assert report.max_rel == pytest.approx(expected_rel)
    mism, numel, max_abs, _, mae = parse(report)
    assert (mism, numel) == (9, 7680)
    assert max_abs == pytest.approx(1e-3, rel=0.05)
    assert mae == pytest.approx(9e-3 / 7680, rel=0.05)
    assert "0.1%" in str(report)
    assert not report.ok
    assert not report.bitwise_equal


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64, torch.int32, torch.bool])
def test_default_tolerances_are_torch_testings(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(500, generator=g, dtype=torch.float64)
    noise = torch.randn(500, generator=g, dtype=torch.float64) * 1e-5
    if dtype.is_complex:
        a, b = torch.complex(base, base).to(dtype), torch.complex(base + noise, base).to(dtype)
    elif dtype == torch.bool:
        a, b = base > 0, (base + noise) > 0
    elif dtype.is_floating_point:
        a, b = (base + noise).to(dtype), base.to(dtype)
    else:
        a, b = (base * 1000).to(dtype), (base * 1000 + noise * 1e5).to(dtype)
    report = compare(a, b)
    rtol, atol = default_tolerances(a, b)
    leaf = report.leaves[0]
    assert (leaf.rtol, leaf.atol) == (rtol, atol)
    expected = (~torch.isclose(a.to(torch.complex128 if dtype.is_complex else torch.float64),
                               b.to(torch.complex128 if dtype.is_complex else torch.float64),
                               rtol=rtol, atol=atol)).sum().item()
    assert report.mismatched == expected
    try:
        torch.testing.assert_close(a, b)
        agrees = True
    except AssertionError:
        agrees = False
    assert report.ok == agrees


def test_compare_tolerances_must_come_together() -> None:
    with pytest.raises(ValueError, match=r"rtol=0.1 and atol=None: give both tolerances or neither"):
        compare(torch.ones(2), torch.ones(2), rtol=0.1)
    loose = compare(torch.tensor([1.0]), torch.tensor([1.05]), rtol=0.1, atol=0.0)
    assert loose.ok
    assert not loose.bitwise_equal


def test_nested_report_has_a_line_per_tensor_and_names_problems() -> None:
    a = {"logits": torch.ones(2, 3), "aux": [torch.zeros(4), 3, "x"], "only_a": 1.0}
    b = {"logits": torch.ones(2, 3) * 1.5, "aux": [torch.zeros(5), 3, "y"], "only_b": None}
    report = compare(a, b)
    text = str(report)
    assert "output['logits']: 6 / 6 mismatched (100.0%)" in text
    assert "output['aux'][0]: shape (4,) vs (5,) in the reference" in text
    assert "output['aux'][1]: 0 / 1 mismatched" in text
    assert "output['aux'][2]: 'x' vs 'y' in the reference" in text
    assert "output['only_a']: only in the compared output" in text
    assert "output['only_b']: only in the reference" in text
    assert not report.ok
    mism, numel, *_ = parse(report)
    assert (mism, numel) == (6, 7)


def test_dtype_and_length_differences_are_problems() -> None:
    report = compare([torch.ones(2)], [torch.ones(2, dtype=torch.float64), torch.ones(1)])
    assert not report.ok
    assert "output: 1 items vs 2 in the reference" in str(report)
    assert "dtype float32 vs float64" in str(report)
    assert report.leaves[0].mismatched == 0  # the values agree; the dtype does not


def test_nan_handling() -> None:
    nan = float("nan")
    same = compare(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]))
    assert same.ok
    assert same.bitwise_equal
    strict = compare(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]), equal_nan=False)
    assert strict.mismatched == 1
    one_sided = compare(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0]))
    assert one_sided.mismatched == 1
    assert "max abs nan" in str(one_sided)


def test_tiny_mismatch_share_is_never_printed_as_zero() -> None:
    a = torch.zeros(100_000)
    b = a.clone()
    b[0] = 1.0
    assert "1 / 100000 mismatched (0.001%)" in str(compare(a, b))


def test_report_in_pytest_and_interactively() -> None:
    good = compare(torch.ones(3), torch.ones(3))
    assert good
    assert good.ok
    good.assert_ok()
    bad = compare(torch.ones(3), torch.zeros(3))
    assert not bad
    with pytest.raises(AssertionError, match=r"outputs differ\n3 / 3 mismatched \(100.0%\)"):
        bad.assert_ok("outputs differ")
    assert repr(bad).startswith("<Report ok=False: 3 / 3 mismatched")


# -- assert_reproducible ----------------------------------------------------
def test_assert_reproducible_passes_for_seeded_randomness() -> None:
    def fn(x: torch.Tensor) -> dict[str, Any]:
        return {"dropout": nn.functional.dropout(x, 0.5), "py": random.random(),
                "np": float(np.random.rand()), "randn": torch.randn(3)}

    assert_reproducible(fn, torch.ones(64), runs=3, seed=7)


def test_assert_reproducible_fails_readably_on_os_entropy() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        return x * torch.rand(x.shape, generator=g)

    with pytest.raises(AssertionError) as info:
        assert_reproducible(fn, torch.ones(256))
    text = str(info.value)
    assert text.startswith("test_assert_reproducible_fails_readably_on_os_entropy.<locals>.fn is "
                           "not reproducible: run 2 of 2 from seed=0 differs from run 1.")
    line = text.splitlines()[1]
    m = SUMMARY.match(line)
    assert m, line
    assert int(m[2]) == 256
    assert int(m[1]) > 200
    assert "os.urandom" in text


def test_assert_reproducible_restores_the_callers_rng() -> None:
    torch.manual_seed(3)
    random.seed(3)
    before = (torch.get_rng_state(), random.getstate())
    assert_reproducible(lambda: (torch.rand(5), random.random()))
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]


def test_assert_reproducible_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"runs=1 must be an int of at least 2"):
        assert_reproducible(torch.rand, 3, runs=1)
    with pytest.raises(ValueError, match=r"seed=-1 is out of range"):
        assert_reproducible(torch.rand, 3, seed=-1)


def test_assert_reproducible_seeds_a_simulated_cuda_device(simulate_device: Any) -> None:
    fake = simulate_device("cuda", count=2, accelerator=True)
    assert_reproducible(lambda: (fake.draw(0), fake.draw(1)))
    # The check can fail: without devrng's seeding the simulated draws differ.
    with pytest.raises(AssertionError, match="not reproducible"):
        assert_reproducible(lambda: fake.generators[0].manual_seed(
            int.from_bytes(os.urandom(4), "little")) and fake.draw(0))


# -- compare_grad_modes -----------------------------------------------------
def test_compare_grad_modes_resnet_agrees_to_rounding_error_on_cpu() -> None:
    model = TinyResNet().eval()
    images = torch.randn(4, 3, 16, 16)
    report = compare_grad_modes(model, images)
    print(report)
    assert report.ok, report
    assert report.numel == 40
    assert report.max_abs < 1e-5


def test_compare_grad_modes_in_training_mode_restores_buffers_and_rng() -> None:
    model = TinyResNet().train()
    images = torch.randn(4, 3, 16, 16)
    stats = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    report = compare_grad_modes(model, images)
    assert report.ok, report  # same dropout mask in both runs
    for name, value in model.state_dict().items():
        assert torch.equal(value, stats[name]), name
    assert torch.equal(torch.get_rng_state(), rng)


def test_compare_grad_modes_catches_a_backend_that_differs_without_grad() -> None:
    class Broken(nn.Module):  # stands in for a backend with a broken no_grad kernel
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if torch.is_grad_enabled() else x + 1e-3 * (x > 0)

    x = torch.randn(1000)
    report = compare_grad_modes(Broken(), x)
    assert report.mismatched == int((x > 0).sum())
    assert report.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert "no_grad vs grad" in str(report)


# -- compare_devices --------------------------------------------------------
def test_compare_devices_cpu_against_itself_is_bitwise() -> None:
    net = conv_net()
    weight = net[0].weight.detach().clone()
    x = torch.randn(2, 3, 16, 16)
    rng = torch.get_rng_state()
    report = compare_devices(net, x, devices=("cpu", "cpu"))
    assert report.bitwise_equal
    assert "cpu vs cpu" in str(report)
    assert torch.equal(net[0].weight, weight)
    assert torch.equal(torch.get_rng_state(), rng)


def test_compare_devices_unpacks_tuples_and_moves_modules_in_inputs() -> None:
    def fn(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": model(x), "noise": torch.rand(3)}

    report = compare_devices(fn, (conv_net(), torch.randn(2, 3, 8, 8)), devices=("cpu", "cpu"))
    assert [leaf.path for leaf in report.leaves] == ["output['out']", "output['noise']"]
    assert report.bitwise_equal  # the same seed before each run


def test_compare_devices_rejects_bad_devices() -> None:
    with pytest.raises(ValueError, match=r"devices='cpu' must name at least two devices"):
        compare_devices(torch.sin, torch.ones(1), devices="cpu")
    with pytest.raises(ValueError, match=r"'nope' in devices is not a device"):
        compare_devices(torch.sin, torch.ones(1), devices=("cpu", "nope"))


def test_compare_devices_conv_net_cpu_vs_xla() -> None:
    pytest.importorskip("torch_xla")
    net = conv_net()
    x = torch.randn(8, 3, 32, 32)
    report = compare_devices(net, x, devices=("cpu", "xla:0"))
    print(report)
    # Structure of the report.
    assert len(report.leaves) == 1
    leaf = report.leaves[0]
    assert (leaf.path, leaf.shape, leaf.dtype) == ("output", (8, 10), "float32")
    assert (leaf.rtol, leaf.atol) == default_tolerances(torch.float32)
    mism, numel, max_abs, max_rel, mae = parse(report)
    assert numel == 80
    assert "xla:0 vs cpu" in str(report)
    # The figures are computed: recompute them from our own runs on both devices.
    with torch.no_grad():
        ref = net(x).double()
        other = copy.deepcopy(net).to("xla:0")(x.to("xla:0")).cpu().double()
    diff = (other - ref).abs()
    assert report.max_abs == pytest.approx(diff.max().item(), abs=1e-12)
    assert report.mae == pytest.approx(diff.mean().item(), abs=1e-12)
    assert mism == int((diff > leaf.atol + leaf.rtol * ref.abs()).sum())
    assert max_abs == pytest.approx(diff.max().item(), rel=0.06, abs=1e-30)
    assert mae == pytest.approx(diff.mean().item(), rel=0.06, abs=1e-30)
    assert max_rel == pytest.approx(report.max_rel, rel=0.06, abs=1e-30)
    assert report.ok  # XLA on the CPU agrees with torch's CPU kernels within float32 tolerance


def test_compare_devices_xla_sees_a_device_specific_difference() -> None:
    pytest.importorskip("torch_xla")

    def fn(x: torch.Tensor) -> torch.Tensor:  # differs on purpose on XLA
        return x + (1.0 if x.device.type == "xla" else 0.0) * (x > 1)

    x = torch.randn(500)
    report = compare_devices(fn, x, devices=("cpu", "xla:0"))
    assert report.mismatched == int((x > 1).sum())
    assert report.max_abs == pytest.approx(1.0)


def test_assert_reproducible_with_xla_dropout() -> None:
    pytest.importorskip("torch_xla")
    import torch_xla.core.xla_model as xm

    x = torch.ones(256, device="xla:0")
    assert_reproducible(nn.functional.dropout, x, p=0.5)

    def unseeded(x: torch.Tensor) -> torch.Tensor:
        xm.set_rng_state(int.from_bytes(os.urandom(4), "little"), "xla:0")
        return nn.functional.dropout(x, 0.5)

    with pytest.raises(AssertionError, match=r"unseeded is not reproducible[^\n]*\n\d+ / 256"):
        assert_reproducible(unseeded, x)
