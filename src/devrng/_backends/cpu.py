"""The CPU backend: torch's default generator."""

from __future__ import annotations

import torch

from devrng._backends.host import seed_cpu

__all__ = ["CPUBackend", "backend"]


class CPUBackend:
    """torch's CPU default generator; always available, one device."""

    name = "cpu"

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, index: int = 0) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(self, state: torch.Tensor, index: int = 0) -> None:
        torch.default_generator.set_state(state)

    def manual_seed(self, seed: int) -> None:
        seed_cpu(seed)  # all 64 bits (torch's manual_seed keeps the low 32)


backend = CPUBackend()
