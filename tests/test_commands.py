"""Whether the command a check launches (``devrng check-resume -- python train.py``) can
import devrng: asked before the first run, of made-up interpreters here (issue 47)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests._helpers import run_env
from tests._internals import devrng_missing, devrng_missing_in_output


def _program(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.fixture
def pythons(tmp_path: Path) -> tuple[Path, Path]:
    """Two folders, each with a ``python``: one without devrng (this interpreter isolated
    from its site-packages and PYTHONPATH, as a system Python is), one with it."""
    without, with_ = tmp_path / "system", tmp_path / "venv"
    for folder, flags in ((without, " -I -S"), (with_, "")):
        folder.mkdir()
        for name in ("python", "python3.11"):
            _program(folder, name, f'#!/bin/sh\nexec "{sys.executable}"{flags} "$@"\n')
    return without, with_


def _env(folder: Path) -> dict[str, str]:
    return run_env({"PATH": f"{folder}{os.pathsep}/usr/bin:/bin"})


def test_a_python_on_path_without_devrng_is_named_with_the_fix(pythons: tuple[Path, Path]
                                                                ) -> None:
    without, with_ = pythons
    said = devrng_missing(["python", "train.py", "--epochs", "3"], _env(without))
    assert said is not None
    assert said.startswith(f"the command's Python, 'python' ({without / 'python'}), cannot "
                           "import devrng. devrng is installed in the Python at "
                           f"{sys.executable}: give the command with that Python "
                           f"(-- {sys.executable} train.py --epochs 3), or activate its "
                           "environment"), said
    assert devrng_missing(["python", "train.py"], _env(with_)) is None
    assert devrng_missing([str(with_ / "python"), "train.py"], _env(without)) is None


@pytest.mark.parametrize("first_lines", [
    "#!{python}\n",
    "#!/usr/bin/env python3.11\n",
    # pip's form where the interpreter's path is too long for a #! line
    "#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n",
], ids=["#!path", "#!env", "pip's long path"])
def test_a_console_script_is_asked_through_the_python_its_first_line_names(
        pythons: tuple[Path, Path], tmp_path: Path, first_lines: str) -> None:
    without, with_ = pythons
    for folder, missing in ((without, True), (with_, False)):
        script = _program(tmp_path, "torchrun",
                          first_lines.format(python=folder / "python3.11") + "import sys\n")
        said = devrng_missing([str(script), "train.py"], _env(folder))
        assert (said is not None) == missing, said
        if said is not None:
            assert f"'{script}' ({script}), a script of {folder / 'python3.11'}, cannot " \
                   "import devrng" in said
            assert "activate its environment" in said and "give the command" not in said


def test_a_program_not_on_path_is_said_and_a_shell_script_is_left_to_its_run(
        pythons: tuple[Path, Path], tmp_path: Path) -> None:
    without, _ = pythons
    said = devrng_missing(["pyhton", "train.py"], _env(without))
    assert said is not None and said.startswith(
        "the command cannot be started: 'pyhton' is not found on the PATH the runs get.")
    shell = _program(tmp_path, "train.sh", "#!/bin/sh\npython train.py\n")
    assert devrng_missing([str(shell)], _env(without)) is None  # its run's output is read
    assert devrng_missing(["bash", str(shell)], _env(without)) is None
    assert devrng_missing([], _env(without)) is None


def test_a_run_that_failed_at_import_devrng_is_explained() -> None:
    output = ("Traceback (most recent call last):\n  File \"train.py\", line 4, in <module>\n"
              "    import devrng\nModuleNotFoundError: No module named 'devrng'\n")
    said = devrng_missing_in_output(output)
    assert said is not None and said.startswith("The run's Python cannot import devrng. "
                                                f"devrng is installed in the Python at "
                                                f"{sys.executable}: activate")
    assert devrng_missing_in_output("ModuleNotFoundError: No module named 'torch'\n") is None
