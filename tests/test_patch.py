"""patch_torch / unpatch_torch: third-party code calling torch's fork_rng gets devrng's."""

from __future__ import annotations

from typing import Any

import torch

import devrng


def test_patch_points_torch_at_devrng_and_unpatch_restores() -> None:
    original = torch.random.fork_rng
    had_attr = hasattr(torch, "fork_rng")
    try:
        devrng.patch_torch()
        devrng.patch_torch()  # idempotent
        assert torch.random.fork_rng is devrng.fork_rng
        assert torch.fork_rng is devrng.fork_rng  # type: ignore[attr-defined]
    finally:
        devrng.unpatch_torch()
        devrng.unpatch_torch()
    assert torch.random.fork_rng is original
    assert hasattr(torch, "fork_rng") == had_attr


def test_third_party_code_forks_simulated_xpu_after_patching(simulate_device: Any) -> None:
    xpu = simulate_device("xpu", count=1)

    def library_code() -> None:  # written against torch, unaware of devrng
        with torch.random.fork_rng(devices=["xpu:0"]):
            xpu.draw(0)

    snap = xpu.generators[0].get_state()
    devrng.patch_torch()
    try:
        library_code()
    finally:
        devrng.unpatch_torch()
    assert torch.equal(xpu.generators[0].get_state(), snap)
