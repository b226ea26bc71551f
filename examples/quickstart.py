"""devrng in one minute: fork the RNG on any device, save and restore snapshots, seed everything.

Run:  python examples/quickstart.py            (the accelerator if there is one, else the CPU)
      python examples/quickstart.py xla:0      (any device torch can reach)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import devrng


def pick_device() -> torch.device:
    if len(sys.argv) > 1:
        device = torch.device(sys.argv[1])
        if device.type == "xla":
            import torch_xla  # noqa: F401  (registers the XLA device with torch)
        return device
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    # A CUDA build names CUDA as its accelerator even without a GPU: ask whether it works.
    if accelerator is not None and accelerator.is_available():
        current = accelerator.current_accelerator()
        if current is not None:
            return current
    return torch.device("cpu")


def main() -> None:
    device = pick_device()
    print(f"device: {device}")

    # 1. Seed torch's CPU generator, every available device, Python and NumPy at once.
    devrng.manual_seed(1234)

    # 2. fork_rng infers the device types from what you hand it, so the draws
    #    inside the block leave no trace on any generator outside it.
    x = torch.ones(8, device=device)
    before = torch.rand(3, device=device)
    devrng.manual_seed(1234)
    with devrng.fork_rng(devices=[x]):
        torch.nn.functional.dropout(x, p=0.5)  # consumes randomness on `device`
        torch.rand(100)                       # and on the CPU
    after = torch.rand(3, device=device)
    assert torch.equal(before.cpu(), after.cpu()), "fork_rng leaked randomness"
    print("fork_rng: the draws after the block are those of an untouched generator")

    # 3. Snapshots: save every generator to a file, keep drawing, load, draw again.
    snapshot = devrng.get_rng_state(devices=[x])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rng.pt"
        snapshot.save(path)
        first = torch.randn(4, device=device).cpu()
        devrng.set_rng_state(devrng.RNGState.load(path))
        again = torch.randn(4, device=device).cpu()
    assert torch.equal(first, again), "the snapshot did not restore the draws"
    print(f"snapshot {snapshot.fingerprint()}: saved, loaded, same draws again")

    # 4. The same seed gives the same numbers, on every generator it covers.
    devrng.manual_seed(7)
    a = torch.rand(2, device=device).cpu()
    devrng.manual_seed(7)
    b = torch.rand(2, device=device).cpu()
    assert torch.equal(a, b)
    print(f"manual_seed(7) twice: {a.tolist()} both times")


if __name__ == "__main__":
    main()
