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

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _run_snippet(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_readme_first_snippet_runs_as_copied(tmp_path: Path) -> None:
    first = PYTHON_BLOCKS[0]
    assert "import devrng" in first and "torch_xla" not in first  # a CPU-only start
    proc = _run_snippet(first, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_xla_snippet_runs_as_copied(tmp_path: Path) -> None:
    xla = next(block for block in PYTHON_BLOCKS if "import torch_xla" in block)
    if not available("torch_xla"):
        pytest.skip("torch_xla is not installed here (the xla environment runs this)")
    proc = _run_snippet(xla, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_commands_are_what_ci_runs() -> None:
    ci = (EXAMPLES.parent / ".ci" / "run").read_text(encoding="utf-8")
    for command in re.findall(r"```bash\n(bash scripts/\w+\.sh)", README):
        assert command in ci, f"README says {command!r}; .ci/run does not run it"
    assert "bash scripts/test.sh" in ci and "bash scripts/run.sh" in ci


# -- the docs' code blocks ------------------------------------------------------------
_DOC_BLOCKS = [
    pytest.param(code, id=f"{page.relative_to(EXAMPLES.parent)}#{i}")
    for page in sorted((EXAMPLES.parent / "docs").rglob("*.md"))
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"),
                                        flags=re.S))
    # A whole program starts with its imports; fragments (names from the text around
    # them, `...` for the rest) start with a comment saying where their names come from.
    if code.lstrip().startswith(("import ", "from ")) and "..." not in code
]


def test_there_are_whole_programs_in_the_docs() -> None:
    assert len(_DOC_BLOCKS) >= 5


@pytest.mark.parametrize("code", _DOC_BLOCKS)
def test_docs_code_block_runs(code: str, tmp_path: Path) -> None:
    imported = re.findall(r"^\s*(?:import|from)\s+([\w.]+)", code, flags=re.M)
    missing = sorted({m.split(".")[0] for m in imported if not available(m.split(".")[0])})
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, not installed here")
    proc = _run_snippet(code, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
