"""Every command the README shows runs as written on what the README gives (issue 47).

The commands are read from the README's ``bash`` blocks. Each one either runs here, as a
user types it in an activated environment (``python`` and ``devrng`` are this
environment's), in a folder holding what the README gives (its ``train.py``); or it is one
that installs, builds the test environments or downloads, and a test named below (checked to
exist) or CI (``.ci/run``) runs it. A command added to the README fails
``test_every_readme_command_is_run_here_or_by_a_named_test`` until it is placed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests._docblocks import python_blocks
from tests._helpers import run_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_BASH = re.compile(r"^```bash\n(.*?)^```", flags=re.M | re.S)


def readme_commands(markdown: str) -> list[str]:
    """The commands of ``markdown``'s bash blocks, one a line, their comments left off."""
    found = []
    for block in _BASH.findall(markdown):
        for line in block.splitlines():
            command = re.sub(r"(^|\s+)#.*$", "", line).strip()
            if command:
                found.append(command)
    return found


# Run here, each with what it must say.
RUN_HERE = {
    "devrng check-resume --steps 40 --stop 20 -- python train.py": "resume exact for steps",
    "devrng check-determinism --steps 20 -- python train.py": "deterministic for steps 1..20",
    "devrng doctor --load": "Backends:",
    "devrng selftest": "0 failed",
}
# Run elsewhere: a command's start, and the tests (file::function) or CI file that run it.
ELSEWHERE = {
    "pip install torch --index-url": ["tests/test_docs.py::test_install_commands_work_as_written"],
    "pip install .": ["tests/test_docs.py::test_install_commands_work_as_written",
                      "tests/test_release.py::test_the_wheel_installs_without_a_compiler_and_passes_its_self_test"],
    'pip install ".[': ["tests/test_docs.py::test_install_commands_work_as_written"],
    "pip install dist/": ["tests/test_release.py::test_the_wheel_installs_without_a_compiler_and_passes_its_self_test"],
    "pip wheel --no-deps -w dist .": ["tests/test_release.py::test_the_sdist_and_wheel_carry_this_version_and_pass_twine_check"],
    "bash scripts/run.sh": [".ci/run", "tests/test_scripts.py::test_the_main_jobs_failed_devrng_install_is_retried_by_the_next_run"],
    "bash scripts/test.sh": [".ci/run", "tests/test_scripts.py::test_test_sh_shows_progress_fails_on_failures_and_on_no_tests_and_cleans_up"],
    "DEVRNG_ENVS=core bash scripts/test.sh": ["tests/test_scripts.py::test_test_sh_shows_progress_fails_on_failures_and_on_no_tests_and_cleans_up"],
}


def _runner(command: str) -> str | None:
    """Where ``command`` is run: "here", a start of ``ELSEWHERE``, or None."""
    if command in RUN_HERE:
        return "here"
    starts = [start for start in ELSEWHERE if command.startswith(start)]
    return max(starts, key=len) if starts else None


def test_readme_commands_are_read_whole() -> None:
    sample = ('```bash\npip install .      # devrng\ndevrng doctor\n\n# a comment\n```\n'
              '```python\nprint(1)  # not a command\n```\n')
    assert readme_commands(sample) == ["pip install .", "devrng doctor"]


def test_every_readme_command_is_run_here_or_by_a_named_test() -> None:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 10 and set(RUN_HERE) <= set(commands)
    unplaced = [c for c in commands if _runner(c) is None]
    assert not unplaced, (f"README commands no test runs: {unplaced}; run them in "
                          "tests/test_readme_commands.py (RUN_HERE) or name the test that "
                          "does (ELSEWHERE)")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for start in {_runner(c) for c in commands} - {"here"}:
        for where in ELSEWHERE[start or ""]:
            if where == ".ci/run":
                assert start in ci, f".ci/run does not run {start!r}"
                continue
            path, name = where.split("::")
            assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), where


def _user_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder with the README's train.py, and the environment of a user who activated
    this test's Python environment: its ``python`` and ``devrng`` first on PATH."""
    (program,) = [b.code for b in python_blocks(README) if "devrng.TrainingRNG(" in b.code]
    (tmp_path / "train.py").write_text(program, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # (Scripts, not links: a link to a virtualenv's python outside it is not in the virtualenv.)
    for name, runs in (("python", ""), ("devrng", " -m devrng")):  # devrng: its console script
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{runs} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    env = run_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"})
    return tmp_path, env


@pytest.mark.parametrize("command", [
    pytest.param(c, id=c.split(" --")[0],
                 marks=[pytest.mark.slow] if "check-" in c else [])  # two or three trainings
    for c in RUN_HERE])
def test_readme_command_runs_as_written(command: str, tmp_path: Path) -> None:
    folder, env = _user_folder(tmp_path)
    proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert RUN_HERE[command] in proc.stdout, proc.stdout[-3000:]
