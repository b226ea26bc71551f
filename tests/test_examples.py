"""Run every script in examples/ in a subprocess with this interpreter.

Scripts are found when the tests are collected, so new examples are picked up
without editing this file. A script declares what it needs in comment lines
at its top (each starting at column 0, anywhere in its first 40 lines):

    # requires: torch_xla, torchax       importable modules or commands (e.g. torchrun);
                                         the example is skipped when one is missing
    # launch: torchrun --standalone --nproc-per-node=2
                                         how to start it instead of `python script.py`
                                         (the first word is looked up beside this
                                         interpreter, then on PATH)
    # timeout: 300                       seconds before the example counts as hung
    # tested-by: tests/test_distributed.py
                                         another test file runs this example (with
                                         checks of its own); skipped here, so it
                                         does not run twice

PJRT_DEVICE defaults to CPU, so XLA examples run on machines without a TPU.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests._docblocks import Block, console, python_blocks, whole_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
MARKER = re.compile(r"^#\s*(requires|launch|timeout|tested-by)\s*:\s*(.*?)\s*$")
DEFAULT_TIMEOUT = 600


def markers(script: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    with script.open(encoding="utf-8") as f:
        for _, line in zip(range(40), f, strict=False):
            m = MARKER.match(line)
            if m:
                found[m[1]] = m[2]
    return found


def executable(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def available(requirement: str) -> bool:
    try:
        if importlib.util.find_spec(requirement) is not None:
            return True
    except (ImportError, ValueError):
        pass
    return executable(requirement) is not None


def command(script: Path, launch: str | None) -> list[str]:
    if not launch:
        return [sys.executable, str(script)]
    words = shlex.split(launch)
    first = sys.executable if words[0] in ("python", "python3") else executable(words[0])
    if first is None:
        pytest.skip(f"{script.name} is launched with {words[0]!r}, which is not installed")
    return [first, *words[1:], str(script)]


def test_examples_exist() -> None:
    assert SCRIPTS, f"no examples found in {EXAMPLES}"


def test_markers_are_parsed(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text('"""Doc."""\n# requires: torch_xla,  torchax\n# launch: torchrun --nproc-per-node=2\n'
                      "# timeout: 30\n# tested-by: tests/x.py\nprint()\n")
    assert markers(script) == {"requires": "torch_xla,  torchax",
                               "launch": "torchrun --nproc-per-node=2", "timeout": "30",
                               "tested-by": "tests/x.py"}
    assert available("pytest")
    assert not available("devrng_no_such_module_or_command")


@pytest.mark.slow  # a fresh interpreter per program
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_runs(script: Path) -> None:
    spec = markers(script)
    owner = spec.get("tested-by")
    if owner:
        assert (EXAMPLES.parent / owner).is_file(), f"{script.name}: tested-by {owner!r} does not exist"
        pytest.skip(f"{script.name} is run by {owner}")
    missing = [r.strip() for r in spec.get("requires", "").split(",")
               if r.strip() and not available(r.strip())]
    if missing:
        pytest.skip(f"{script.name} requires {', '.join(missing)}, not installed here")
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    cmd = command(script, spec.get("launch"))
    timeout = float(spec.get("timeout", DEFAULT_TIMEOUT))
    try:
        proc = subprocess.run(cmd, cwd=EXAMPLES.parent, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{script.name} did not finish within {timeout:g} s: {shlex.join(cmd)}\n"
                    f"{err.stdout or ''}\n{err.stderr or ''}")
    assert proc.returncode == 0, (
        f"{shlex.join(cmd)} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-4000:]}"
    )


def test_api_reference_documents_every_public_name() -> None:
    """docs/api.md names each public name, so a new one cannot be left out of the reference."""
    import devrng
    import devrng.testing

    api = (EXAMPLES.parent / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: ([\w.]+)", api, flags=re.M))
    for name in devrng.__all__:
        assert f"devrng.{name}" in documented, f"docs/api.md has no '::: devrng.{name}'"
    for name in devrng.testing.__all__:
        assert name in api, f"docs/api.md does not document devrng.testing.{name}"


# -- the README -------------------------------------------------------------------
README = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")


def test_readme_commands_are_what_ci_runs() -> None:
    ci = (EXAMPLES.parent / ".ci" / "run").read_text(encoding="utf-8")
    for command in re.findall(r"```bash\n(bash scripts/\w+\.sh)", README):
        assert command in ci, f"README says {command!r}; .ci/run does not run it"
    assert "bash scripts/test.sh" in ci and "bash scripts/run.sh" in ci


def _run_snippet(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


# -- the docs' code blocks ------------------------------------------------------------
HEAVY = ("torch_xla", "torchax", "jax", "intel_extension_for_pytorch")


DOC_PAGES = sorted((EXAMPLES.parent / "docs").rglob("*.md"))
_DOC_BLOCKS = [block for page in DOC_PAGES for block in python_blocks(page)]
_PROGRAMS = [pytest.param(b, id=b.where) for b in _DOC_BLOCKS if whole_program(b.code)]
_CONSOLE = [pytest.param(b, id=b.where) for b in _DOC_BLOCKS if console(b.code)]


def _missing(code: str) -> list[str]:
    imported = re.findall(r"^\s*(?:>>> )?(?:import|from)\s+([\w.]+)", code, flags=re.M)
    return sorted({m.split(".")[0] for m in imported if not available(m.split(".")[0])})


def test_there_are_whole_programs_in_the_docs() -> None:
    assert len(_PROGRAMS) >= 5 and len(_CONSOLE) >= 3
    assert sum(b.output is not None for b in _DOC_BLOCKS) >= 2


@pytest.mark.slow  # a fresh interpreter per program
@pytest.mark.parametrize("block", _PROGRAMS)
def test_docs_code_block_runs(block: Block, tmp_path: Path) -> None:
    """Each whole program runs; where a text block follows it, that is what it prints."""
    if block.where.startswith("docs/trainers/"):
        pytest.skip("tests/integrations/test_trainer_docs.py runs it, stopped and resumed")
    missing = _missing(block.code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, not installed here")
    proc = _run_snippet(block.code, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    if block.output is not None:
        assert_shown(block.output, proc.stdout)


def assert_shown(shown: str, printed: str) -> None:
    """``printed`` is what the page shows (trailing spaces aside; ``...`` stands for anything)."""
    def tidy(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"

    checker = doctest.OutputChecker()
    assert checker.check_output(tidy(shown), tidy(printed), doctest.ELLIPSIS), (
        f"the page shows:\n{shown}\nthe program prints:\n{printed}")


def test_shown_output_comes_after_a_whole_program() -> None:
    """A fragment cannot run, so output shown after one could not be checked."""
    unchecked = [b.where for b in _DOC_BLOCKS if b.output is not None and not whole_program(b.code)]
    assert not unchecked, f"output shown after a fragment: {unchecked}"


def test_the_output_check_fails_on_a_difference() -> None:
    assert_shown("1 / 2 mismatched ...\n  a\n", "1 / 2 mismatched (50.0%)\n  a  \n")
    with pytest.raises(AssertionError, match="the program prints"):
        assert_shown("6 / 7 mismatched\n", "MISMATCH: output\n")


_CONSOLE_RUNNER = """
import doctest, sys
test = doctest.DocTestParser().get_doctest(sys.stdin.read(), {}, "docs", None, 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
sys.exit(1 if runner.run(test).failed else 0)
"""


@pytest.mark.slow  # a fresh interpreter per program
@pytest.mark.parametrize("block", _CONSOLE)
def test_docs_console_block_shows_what_it_prints(block: Block, tmp_path: Path) -> None:
    """``>>>`` blocks run as doctests, each in a fresh process, with nothing imported: as a
    user pastes them into a new interpreter."""
    missing = _missing(block.code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, not installed here")
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    proc = subprocess.run([sys.executable, "-c", _CONSOLE_RUNNER], input=block.code, cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# -- the README's blocks, each run as copied ---------------------------------------------


def _run_file(code: str, where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` saved as a file in ``where`` and run there, as a user runs a copied block."""
    script = where / "block.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    return subprocess.run([sys.executable, str(script), *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _readme_blocks() -> list[Block]:
    return python_blocks(EXAMPLES.parent / "README.md")


def test_every_readme_block_is_a_whole_program() -> None:
    """The README has no fragments: each Python block starts with its imports and leaves
    nothing out (``...``), so that it runs as copied."""
    blocks = _readme_blocks()
    assert len(blocks) >= 4
    assert [b.where for b in blocks if not whole_program(b.code)] == []
    first = blocks[0].code
    assert "import devrng" in first and "torch_xla" not in first  # a CPU-only start


_RESUME = "devrng.TrainingRNG("  # the resume program, run by its own test below


@pytest.mark.slow  # a fresh interpreter per program
@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in _readme_blocks()
                                   if _RESUME not in b.code])
def test_readme_block_runs_as_copied(block: Block, tmp_path: Path) -> None:
    missing = _missing(block.code)
    if missing:  # the XLA block: the xla environment runs it
        pytest.skip(f"needs {', '.join(missing)}, not installed here")
    proc = _run_file(block.code, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter per program
def test_readme_resume_program_continues_bitwise_in_a_new_process(tmp_path: Path) -> None:
    """README: `python train.py 2` then `python train.py 3` prints for epoch 2 what an
    uninterrupted `python train.py 3` prints."""
    (code,) = [b.code for b in _readme_blocks() if _RESUME in b.code]
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    stopped.mkdir()
    whole.mkdir()
    runs = [_run_file(code, stopped, "2"), _run_file(code, stopped, "3"),
            _run_file(code, whole, "3")]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    first, resumed, uninterrupted = (proc.stdout.splitlines() for proc in runs)
    assert [line.split(":")[0] for line in uninterrupted] == ["epoch 0", "epoch 1", "epoch 2"]
    assert first + resumed == uninterrupted
    assert len(set(uninterrupted)) == 3  # the losses move: the check compares real numbers


# -- the home page ----------------------------------------------------------------------
_NO_DEVICE_PACKAGES = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):   # a CPU-only install: none of these exist
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Absent())
"""


@pytest.mark.slow  # a fresh interpreter per program
def test_home_page_starts_with_a_program_for_a_cpu_only_install(tmp_path: Path) -> None:
    first = python_blocks(EXAMPLES.parent / "docs" / "index.md")[0]
    assert whole_program(first.code), "the home page's first example must run as it is"
    assert not [m for m in HEAVY if m in first.code], "the first example must need only torch"
    blocker = _NO_DEVICE_PACKAGES.format(heavy=set(HEAVY))
    proc = _run_snippet(blocker + first.code, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    broken = _run_snippet(blocker + "import torch_xla", tmp_path)  # the blocker itself works
    assert broken.returncode != 0 and "No module named 'torch_xla'" in broken.stderr
