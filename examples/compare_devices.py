"""Does a device agree with the CPU? Does inference under no_grad agree with autograd on?

Runs a small conv net on the CPU and on every other device found (XLA when
torch_xla is installed — use PJRT_DEVICE=CPU without a TPU —, CUDA, XPU, MPS)
and prints devrng.testing's reports. Without any other device it compares the
CPU with itself, which must be bitwise equal.

Run:  python examples/compare_devices.py
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import nn

from devrng.testing import assert_reproducible, compare_devices, compare_grad_modes


def other_devices() -> list[str]:
    found = []
    if importlib.util.find_spec("torch_xla") is not None:
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        import torch_xla  # noqa: F401  (registers the XLA device with torch)

        found.append("xla:0")
    for name in ("cuda", "xpu", "mps"):
        module = getattr(torch, name, None)
        if module is not None and module.is_available():
            found.append(f"{name}:0")
    return found


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(32, 10),
    )


def main() -> None:
    torch.manual_seed(0)
    net = conv_net().eval()  # eval: devices draw different numbers from one seed
    images = torch.randn(8, 3, 32, 32)

    devices = other_devices() or ["cpu"]
    for device in devices:
        report = compare_devices(net, images, devices=("cpu", device))
        print(f"cpu vs {device}:  {report}")
        report.assert_ok(f"{device} disagrees with the CPU")

    # Autograd on vs torch.no_grad(), in training mode: dropout and batch
    # statistics included, from the same RNG state.
    report = compare_grad_modes(net.train(), images)
    print(f"grad modes (cpu): {report}")
    report.assert_ok("no_grad changes the output")

    # Seeded randomness is reproducible; a generator seeded from the OS is not.
    assert_reproducible(net.train(), images)
    print("assert_reproducible(net, images): passed")

    def unseeded(x: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        return x * torch.rand(x.shape, generator=g)

    try:
        assert_reproducible(unseeded, images)
    except AssertionError as err:
        print("assert_reproducible(unseeded, images) failed as it should:")
        print("  " + "\n  ".join(str(err).splitlines()[:2]))
    else:
        raise SystemExit("assert_reproducible missed a generator seeded from os.urandom")


if __name__ == "__main__":
    main()
