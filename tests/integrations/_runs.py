"""Run a trainer program three times in new processes: whole, stopped after a checkpoint,
resumed from it; return the per-step losses to compare bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(module: str, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "PJRT_DEVICE": "CPU",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, f"{module} {args}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"


def losses(path: Path) -> list[str]:
    return list(json.loads(path.read_text()))


def whole_and_resumed(module: str, mode: str, epochs: int, tmp: Path) -> tuple[list[str], ...]:
    """(whole run, first part, resumed part) of ``module`` in ``mode``."""
    run(module, mode, str(epochs), str(tmp / "whole.json"))
    run(module, mode, "1", str(tmp / "first.json"), "--save", str(tmp / "ckpt"))
    run(module, mode, str(epochs), str(tmp / "resumed.json"), "--resume", str(tmp / "ckpt"))
    return losses(tmp / "whole.json"), losses(tmp / "first.json"), losses(tmp / "resumed.json")
