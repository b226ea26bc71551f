"""scripts/_venv.sh keeps only finished environments, and scripts/test.sh explains itself.

Each test builds small environments in a temporary cache (``DEVRNG_CACHE``) from a copy of
the scripts beside a fake ``envs/fake.txt`` and a fake devrng project (tests/_wheels.py),
offline: pip reads only a folder of hand-written wheels. Failures are injected for real: an
index nothing listens on, an index that never answers while pip is killed or the whole run
is, a package that fails to import, a mark an older script left on a failed install, two
runs at once. scripts/test.sh runs a fake pytest there: its progress line, its exit status
(a failure, no test run), Ctrl-C, its logs removed; and its --help, which builds nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._wheels import write_wheel

ROOT = Path(__file__).resolve().parent.parent
# A new virtual environment (venv and its pip) per test: seconds each, processes of their own.
pytestmark = pytest.mark.slow


class Fake:
    """A checkout (scripts/_venv.sh, envs/fake.txt, a fake devrng project), a wheel folder
    and an empty cache in ``tmp``; ``run`` calls the scripts' functions the way
    scripts/test.sh and scripts/run.sh do."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "checkout"
        (self.root / "scripts").mkdir(parents=True)
        (self.root / "envs").mkdir()
        for script in ("_venv.sh", "test.sh"):
            shutil.copy(ROOT / "scripts" / script, self.root / "scripts")
        shutil.copy(ROOT / "tests" / "_wheels.py", self.root)
        (self.root / "pyproject.toml").write_text(
            '[build-system]\nrequires = []\nbuild-backend = "_wheels"\nbackend-path = ["."]\n')
        self.wheels = tmp / "wheels"
        self.wheels.mkdir()
        self.cache = tmp / "cache"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env.update(DEVRNG_CACHE=str(self.cache), PYTHON=sys.executable,
                        PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
                        PIP_FIND_LINKS=str(self.wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")

    def requirements(self, text: str) -> None:
        (self.root / "envs" / "fake.txt").write_text(text)

    def command(self, call: str) -> list[str]:
        # As scripts/test.sh does: the path from a command substitution, set -e in force.
        return ["bash", "-c", f'source "$0"; dir=$({call}); echo "ready: $dir"',
                str(self.root / "scripts" / "_venv.sh")]

    def run(self, call: str = "venv_for fake", **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(call), env={**self.env, **env}, capture_output=True,
                              text=True, timeout=180)

    def start(self, call: str = "venv_for fake", **env: str) -> subprocess.Popen[str]:
        # A session of its own: the test can stop the whole run, and only it.
        return subprocess.Popen(self.command(call), env={**self.env, **env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)

    def venvs(self) -> list[Path]:
        return sorted(p for p in (self.cache / "venvs").glob("*") if p.is_dir())


def _ready(proc: subprocess.CompletedProcess[str]) -> Path:
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ready: ")]
    assert len(lines) == 1, proc.stdout
    return Path(lines[0].removeprefix("ready: "))


def _failed_and_kept_nothing(proc: subprocess.CompletedProcess[str], fake: Fake) -> None:
    assert proc.returncode != 0, proc.stderr
    assert "ready:" not in proc.stdout  # as in scripts/test.sh: the caller stops there
    assert "FAILED: building the fake environment" in proc.stderr, proc.stderr
    assert "Nothing of it was kept: the next run builds it again." in proc.stderr
    assert fake.venvs() == [], "a failed build left its folder"


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    return Fake(tmp_path)


@pytest.fixture
def silent_index() -> Iterator[tuple[str, socket.socket]]:
    """An index that accepts connections and never answers (the listening socket: its
    ``accept`` returns once pip connected)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/simple/", server


def test_a_built_environment_works_is_marked_finished_and_is_reused(fake: Fake) -> None:
    write_wheel(fake.wheels, "devrng-fake-tool", "1.0",
                {"devrng_fake_tool.py": "def main() -> None:\n    print('tool works')\n"},
                {"devrng-fake-tool": "devrng_fake_tool:main"})
    fake.requirements("devrng-fake-tool==1.0\n")
    first = fake.run()
    venv = _ready(first)
    assert venv.parent == fake.cache / "venvs" and venv.name.startswith("fake-")
    assert (venv / ".complete").is_file()
    assert "== building the fake environment" in first.stderr
    # Built where it stays: its scripts run (their first line names the interpreter).
    tool = subprocess.run([venv / "bin" / "devrng-fake-tool"], capture_output=True, text=True,
                          env=fake.env, check=False)
    assert (tool.returncode, tool.stdout) == (0, "tool works\n"), tool.stderr
    assert subprocess.run([venv / "bin" / "pip", "--version"], capture_output=True,
                          env=fake.env, check=False).returncode == 0
    again = fake.run()
    assert _ready(again) == venv
    assert "building" not in again.stderr


def test_an_unreachable_index_keeps_nothing_and_the_next_run_builds_it(fake: Fake) -> None:
    fake.requirements("devrng-fake-dep==1.0\n")
    down = fake.run(PIP_NO_INDEX="", PIP_INDEX_URL="http://127.0.0.1:9/simple/",
                    PIP_RETRIES="0", PIP_TIMEOUT="5")
    _failed_and_kept_nothing(down, fake)
    assert "installing its packages" in down.stderr
    write_wheel(fake.wheels, "devrng-fake-dep", "1.0", {"devrng_fake_dep.py": ""})
    venv = _ready(fake.run())  # the network is back
    assert (venv / ".complete").is_file()
    assert subprocess.run([venv / "bin" / "python", "-c", "import devrng_fake_dep"],
                          env=fake.env, check=False).returncode == 0


def _pips_of(cache: Path) -> list[int]:
    """The pip processes installing into ``cache`` (this test's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and b"pip" in line and any(str(cache).encode() in a for a in line):
            found.append(int(entry.name))
    return found


def test_a_killed_pip_keeps_nothing(fake: Fake, silent_index: tuple[str, socket.socket]
                                    ) -> None:
    url, server = silent_index
    fake.requirements("devrng-fake-dep==1.0\n")
    proc = fake.start(PIP_NO_INDEX="", PIP_INDEX_URL=url, PIP_TIMEOUT="60")
    try:
        server.settimeout(60)
        connection, _ = server.accept()  # pip is waiting for the index
        with connection:
            pips = _pips_of(fake.cache)
            assert pips, "no pip process found"
            for pid in pips:
                os.kill(pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _failed_and_kept_nothing(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                             fake)


def test_a_run_stopped_mid_build_is_built_again_by_the_next(
        fake: Fake, silent_index: tuple[str, socket.socket]) -> None:
    url, server = silent_index
    fake.requirements("devrng-fake-dep==1.0\n")
    proc = fake.start(PIP_NO_INDEX="", PIP_INDEX_URL=url, PIP_TIMEOUT="60")
    server.settimeout(60)
    connection, _ = server.accept()
    os.killpg(proc.pid, signal.SIGKILL)  # the terminal closed, the machine went down
    proc.communicate(timeout=60)
    connection.close()
    [left] = fake.venvs()
    assert not (left / ".complete").exists()
    write_wheel(fake.wheels, "devrng-fake-dep", "1.0", {"devrng_fake_dep.py": ""})
    again = fake.run()
    assert _ready(again) == left
    assert f"{left} holds an unfinished build of the fake environment" in again.stderr
    assert (left / ".complete").is_file()


def test_a_package_that_fails_to_import_keeps_nothing(fake: Fake) -> None:
    # pip installs it without a word; the smoke import finds it broken.
    write_wheel(fake.wheels, "pytest", "0.0.1",
                {"pytest/__init__.py": "raise ImportError('a broken pytest')\n"})
    fake.requirements("pytest==0.0.1\n")
    broken = fake.run()
    _failed_and_kept_nothing(broken, fake)
    assert "the smoke import (import pytest)" in broken.stderr
    assert "ImportError: a broken pytest" in broken.stderr


def _pytest_wheel(fake: Fake, main: str = "") -> None:
    """The fake environment's only package: a pytest whose ``python -m pytest`` runs ``main``."""
    write_wheel(fake.wheels, "pytest", "0.0.1",
                {"pytest/__init__.py": "", "pytest/__main__.py": main})
    fake.requirements("pytest==0.0.1\n")


def test_an_older_scripts_mark_on_a_failed_install_is_found_out_and_built_again(
        fake: Fake) -> None:
    _pytest_wheel(fake)
    venv = _ready(fake.run())
    # What the older script left after pip failed: the mark (empty), not the packages.
    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "pytest"],
                   env=fake.env, check=True)
    (venv / ".complete").write_text("")
    again = fake.run()
    assert _ready(again) == venv
    assert (f"{venv} was marked finished by an older scripts/_venv.sh, but cannot import "
            "pytest: its install had failed; building the fake environment again") in again.stderr
    assert (venv / ".complete").read_text() == "smoke import passed: pytest\n"
    assert subprocess.run([venv / "bin" / "python", "-c", "import pytest"],
                          env=fake.env, check=False).returncode == 0


def test_an_older_scripts_mark_on_a_good_install_is_kept(fake: Fake) -> None:
    _pytest_wheel(fake)
    venv = _ready(fake.run())
    (venv / ".complete").write_text("")
    (venv / "kept").write_text("")
    again = fake.run()
    assert _ready(again) == venv
    assert "build" not in again.stderr and (venv / "kept").exists()
    assert (venv / ".complete").read_text() == "smoke import passed: pytest\n"


def _held(venvs: Path) -> bool:
    """Whether some run holds the lock of an environment in ``venvs``."""
    for lock in venvs.glob("*.lock"):
        with lock.open() as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(file, fcntl.LOCK_UN)
    return False


def test_two_runs_at_once_build_once_and_both_use_it(fake: Fake, tmp_path: Path) -> None:
    # A Python whose `-m venv` takes 3 s more: the first run holds the lock that long.
    slow = tmp_path / "slow-python"
    slow.write_text('#!/bin/bash\n[ "${1-} ${2-}" = "-m venv" ] && sleep 3\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    fake.requirements("")
    first = fake.start(PYTHON=str(slow))
    deadline = time.monotonic() + 60
    while not _held(fake.cache / "venvs"):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = fake.run(PYTHON=str(slow))
    out, err = first.communicate(timeout=120)
    first_done = subprocess.CompletedProcess(first.args, first.returncode, out, err)
    assert _ready(first_done) == _ready(second)
    assert "building the fake environment" in err
    assert "== waiting: another run is building or updating" in second.stderr
    assert "building" not in second.stderr.replace("is building or updating", "")


def test_an_unknown_environment_is_named_with_the_known_ones(fake: Fake) -> None:
    fake.requirements("")
    proc = fake.run("venv_for fack")
    assert proc.returncode != 0
    assert "there is no environment 'fack': envs/ names fake" in proc.stderr
    assert not (fake.cache / "venvs").exists()


def test_the_main_jobs_failed_devrng_install_is_retried_by_the_next_run(fake: Fake) -> None:
    pytest.importorskip("torch")  # run_venv reuses this interpreter's torch: nothing to fetch
    failed = fake.run("run_venv", DEVRNG_FAKE_BUILD_FAILS="1")
    assert failed.returncode != 0 and "ready:" not in failed.stdout
    assert f"FAILED: pip install {fake.root} into" in failed.stderr, failed.stderr
    [venv] = fake.venvs()
    assert (venv / ".complete").is_file() and not (venv / ".devrng-source").exists()
    fixed = fake.run("run_venv")
    assert _ready(fixed) == venv
    assert (venv / ".devrng-source").is_file()
    devrng = subprocess.run([venv / "bin" / "devrng"], capture_output=True, text=True,
                            env=fake.env, check=False)
    assert devrng.stdout == "fake devrng\n", devrng.stderr


# A pytest that says how far it got, waits DEVRNG_FAKE_PYTEST_SLEEP seconds, and ends as
# DEVRNG_FAKE_PYTEST says: the fake environment's test run, as scripts/test.sh reads it.
FAKE_PYTEST = """import os, sys, time
print("arguments:", sys.argv[1:])
print("tests/test_fake.py .                                         [ 50%]", flush=True)
time.sleep(float(os.environ.get("DEVRNG_FAKE_PYTEST_SLEEP", "0")))
end = os.environ.get("DEVRNG_FAKE_PYTEST", "passed")
print({"passed": "=== 2 passed in 1.00s ===", "failed": "=== 1 failed, 1 passed in 1.00s ===",
       "none": "=== no tests ran in 0.01s ==="}[end])
sys.exit({"passed": 0, "failed": 1, "none": 5}[end])
"""


def test_test_sh_shows_progress_fails_on_failures_and_on_no_tests_and_cleans_up(
        fake: Fake, tmp_path: Path) -> None:
    _pytest_wheel(fake, FAKE_PYTEST)
    temp = tmp_path / "temp"
    temp.mkdir()

    def test_sh(end: str, sleep: str = "0") -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(fake.root / "scripts" / "test.sh"), "-m", "not slow"],
                              env={**fake.env, "DEVRNG_ENVS": "fake", "TMPDIR": str(temp),
                                   "DEVRNG_FAKE_PYTEST": end, "DEVRNG_FAKE_PYTEST_SLEEP": sleep},
                              capture_output=True, text=True, timeout=180)

    passed = test_sh("passed", sleep="12")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "== at 0 min: fake: pytest 50%" in passed.stdout  # while it ran
    assert "arguments: ['-p', 'no:cacheprovider', '--durations=15', '-m', 'not slow']" \
        in passed.stdout
    assert passed.stdout.endswith("all checks passed in: fake\npytest: 2 passed, 0 failed\n")
    assert "until then it is in " + str(temp) in passed.stdout
    assert list(temp.iterdir()) == [], "test.sh left its logs"
    assert "No such file" not in passed.stderr, passed.stderr
    for end, exit_line in [("failed", "fake: pytest (exit 1)"), ("none", "fake: pytest (exit 5)")]:
        proc = test_sh(end)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"FAILED: {exit_line}" in proc.stdout
        assert list(temp.iterdir()) == []


def test_test_sh_stopped_by_ctrl_c_stops_its_checks_and_removes_its_logs(
        fake: Fake, tmp_path: Path) -> None:
    _pytest_wheel(fake, FAKE_PYTEST)
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.Popen(["bash", str(fake.root / "scripts" / "test.sh")], text=True,
                            env={**fake.env, "DEVRNG_ENVS": "fake", "TMPDIR": str(temp),
                                 "DEVRNG_FAKE_PYTEST_SLEEP": "120"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # (a failed test kills the whole group)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the check started
            if line.startswith("== started fake: pytest"):
                break
        # The check opens its log itself, in the background: it may not be there yet.
        deadline = time.monotonic() + 60
        while not (logs := list(temp.glob("devrng-test.*/0.log"))):
            assert time.monotonic() < deadline, "the check never opened its log"
            time.sleep(0.1)
        checks = _pids_writing(logs[0])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left of its group holds the pipes
        proc.communicate(timeout=60)
    assert list(temp.iterdir()) == []
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in checks):  # the check was stopped too
        assert time.monotonic() < deadline, "the check outlived test.sh"
        time.sleep(0.1)


def _pids_writing(log: Path) -> list[int]:
    """The processes whose output goes to ``log`` (the check test.sh started)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = []
        for fd in Path("/proc").glob("[0-9]*/fd/1"):
            try:
                if fd.readlink() == log:
                    found.append(int(fd.parent.parent.name))
            except OSError:
                continue
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no process writes {log}")


def test_test_sh_help_says_what_it_runs_and_builds_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-x", "--help"],
                          env={**os.environ, "DEVRNG_CACHE": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    for said in ("DEVRNG_ENVS", "DEVRNG_JOBS", "DEVRNG_CACHE", "22 GB", "5.7 GB",
                 'DEVRNG_ENVS=core bash scripts/test.sh -m "not slow"', "integrations"):
        assert said in proc.stdout
    assert proc.stderr == "" and list(tmp_path.iterdir()) == []


def test_test_sh_refuses_a_bad_devrng_jobs_before_building(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")],
                          env={**os.environ, "DEVRNG_CACHE": str(tmp_path), "DEVRNG_JOBS": "two"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr == ("DEVRNG_JOBS is 'two': it takes a whole number of checks to run at a "
                           "time, 1 or more.\n")
    assert list(tmp_path.iterdir()) == []
