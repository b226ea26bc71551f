"""The trainer pages' programs, run as written: stopped part way, resumed in a new process, and
bitwise what one uninterrupted run prints (docs/trainers/*.md; the integrations environment).

Each page holds one whole program (a ``python`` block that starts with its imports). It
takes where to stop as its first argument, writes its checkpoints in the working folder and
resumes from them when they are there; it prints "resuming" when it does, and its final
loss with ``repr`` (every bit).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from tests._helpers import ROOT, run_python

# page -> (the package it needs, where the first part stops)
PAGES = {"lightning": ("lightning", "2"), "accelerate": ("accelerate", "2"),
         "transformers": ("transformers", "20")}
pytestmark = pytest.mark.slow


def program(page: str) -> str:
    text = (ROOT / "docs" / "trainers" / f"{page}.md").read_text(encoding="utf-8")
    [code] = [block for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)
              if block.lstrip().startswith(("import ", "from "))]
    return code


def run(code: str, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The program as a user runs it: ``python train.py ARGS`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = run_python(code, args=args, cwd=folder, timeout=600,
                     env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


@pytest.mark.parametrize("page", list(PAGES))
def test_the_pages_program_resumes_bitwise(page: str, tmp_path: Path) -> None:
    package, stop = PAGES[page]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"needs {package} (the integrations environment)")
    if importlib.util.find_spec("torch_xla") is not None and page != "lightning":
        pytest.skip("accelerate and the Trainer pick XLA where torch_xla is installed")
    code = program(page)
    whole = run(code, tmp_path / "whole")
    first = run(code, tmp_path / "parts", stop)
    resumed = run(code, tmp_path / "parts")
    assert "resuming" not in whole.stdout + first.stdout
    assert "resuming" in resumed.stdout
    final = whole.stdout.strip().splitlines()[-1]
    assert first.stdout.strip().splitlines()[-1] != final  # it stopped early
    assert resumed.stdout.strip().splitlines()[-1] == final
    assert "DevRNGWarning" not in resumed.stderr
