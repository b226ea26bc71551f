"""`devrng doctor` and `devrng selftest`, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._fakes import MinimalBackend, registered
from tests._helpers import install_plugin, run_env, run_python

import devrng
from devrng.__main__ import main
from devrng._cli import environment_problems, known_problems

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str | None] | None = None
        ) -> subprocess.CompletedProcess[str]:  # as a user runs it
    return run_python("devrng", module=True, args=args, env=env)


def test_selftest_passes_and_prints_a_table() -> None:
    out = cli("selftest")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["backend", "check", "result"]
    assert any(line.split()[:3] == ["cpu", "fork", "pass"] for line in lines)
    assert "0 failed" in lines[-1]


def test_selftest_fails_with_exit_1_on_a_broken_backend(capsys: Any) -> None:
    class Forgetful(MinimalBackend):
        name = "forgetful"

        def set_rng_state(self, state: Any, index: int) -> None:
            pass  # loses the state: every round trip must fail

    with registered("forgetful", Forgetful()):
        assert main(["selftest"]) == 1
    out = capsys.readouterr().out
    assert "forgetful  snapshot    FAIL" in out or "FAIL" in out.split("forgetful")[1]


def test_doctor_prints_every_section() -> None:
    out = cli("doctor")
    assert out.returncode == 0, out.stderr
    for heading in ("Packages:", "Backends", "Determinism settings:", "Environment variables:",
                    "Known problems of the installed versions:"):
        assert heading in out.stdout
    assert "CUBLAS_WORKSPACE_CONFIG" in out.stdout


@pytest.mark.parametrize(("versions", "needle"), [
    ({"torch": "2.9.0"}, "forks 'cuda' by default"),
    ({"torch": "2.13.0", "torchax": "0.0.13"}, "bakes the PRNG key"),
    ({"torch": "2.13.0", "torch_xla": "2.9.0"}, "torch.manual_seed does not seed XLA"),
    ({"torch": "2.13.0", "intel_extension_for_pytorch": "2.8.0"}, "imports only with torch 2.8.*"),
])
def test_known_problems_follow_installed_versions(versions: dict[str, str], needle: str) -> None:
    assert any(needle in line for line in known_problems(versions))  # type: ignore[arg-type]


def test_no_known_problems_for_a_clean_new_torch() -> None:
    assert known_problems({"torch": "2.13.0"}) == []


def test_ipex_of_the_same_minor_as_torch_is_no_mismatch() -> None:
    lines = known_problems({"torch": "2.8.0+cu128", "intel_extension_for_pytorch": "2.8.0"})
    assert lines and not any("imports only with torch" in line for line in lines)


# -- manners ------------------------------------------------------------------------
def test_no_command_prints_help_and_succeeds() -> None:
    out = cli()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: devrng")
    assert "doctor" in out.stdout and "selftest" in out.stdout


def test_version_and_help_do_not_import_torch() -> None:
    code = ("import sys\n"
            "from devrng.__main__ import main\n"
            "for argv in (['--version'], ['--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exit:\n"
            "        assert exit.code == 0, exit.code\n"
            "print('torch imported:', 'torch' in sys.modules)\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "devrng 0.1.0" in out.stdout
    assert out.stdout.strip().endswith("torch imported: False")


def test_doctor_into_a_closed_pipe_exits_quietly() -> None:
    proc = subprocess.run(f"{sys.executable} -m devrng doctor | head -1", shell=True,
                          capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PJRT_DEVICE": "CPU"})
    assert proc.stdout.startswith("devrng ")
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_doctor_onto_a_full_disk_says_so_in_one_line() -> None:
    with open("/dev/full", "w") as full:
        proc = run_python("devrng", module=True, args=["doctor"], stdout=full)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("devrng")]
    assert lines == ["devrng doctor: could not write the report (No space left on device)."]
    assert "Traceback" not in proc.stderr


def test_doctor_rows_say_one_thing_each() -> None:
    out = cli("doctor").stdout
    backends = out.split("Backends", 1)[1].split("Determinism settings:")[0]
    rows = [line.split() for line in backends.splitlines()[2:] if line.startswith("  ")
            and not line.startswith("  (")]
    for row in rows:  # a package that is not installed is never "not loaded" as well
        assert not ("(not" in row and "installed)" in row and "loaded" in row), row
    assert "torch.initial_seed()" not in out
    assert "(False, False)" not in out and "(True, False)" not in out
    assert "torch.use_deterministic_algorithms" in out
    if not torch.backends.cuda.is_built():  # a device type this build cannot have
        assert "not listed: cuda (this torch is built without CUDA)" in backends


def test_selftest_lists_what_it_did_not_test_and_why() -> None:
    out = cli("selftest").stdout
    assert "Not tested here:" in out
    if not torch.backends.mps.is_built():
        assert "mps: this torch is built without MPS" in out


@pytest.mark.xla
def test_doctor_load_checks_xla_and_warns_about_pjrt_device() -> None:
    pytest.importorskip("torch_xla")
    loaded = cli("doctor", "--load")
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    row = next(line for line in loaded.stdout.splitlines() if line.split()[:1] == ["xla"])
    assert "works (" in row and "a draw and a state round trip" in row
    unset = cli("doctor", env={"PJRT_DEVICE": None})
    assert "PJRT_DEVICE is not set" in unset.stdout
    row = next(line for line in unset.stdout.splitlines() if line.split()[:1] == ["xla"])
    assert "not loaded" in row and "--load" in row


@pytest.mark.xla
def test_selftest_turns_a_failing_backend_into_a_fail_row() -> None:
    pytest.importorskip("torch_xla")
    out = cli("selftest", env={"PJRT_DEVICE": "NOPE"})
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    xla_rows = [line for line in out.stdout.splitlines() if line.startswith("xla ")]
    assert xla_rows and all("FAIL" in line for line in xla_rows)
    assert any(line.split()[:3] == ["cpu", "seed", "pass"] for line in out.stdout.splitlines())


# -- the environment's settings ------------------------------------------------------------
def test_doctor_reports_a_seed_variable_that_is_no_seed_with_the_fix() -> None:
    out = cli("doctor", env={"DEVRNG_SEED": "abc"})
    assert out.returncode == 1, out.stdout + out.stderr
    problems = out.stdout.split("Problems in this environment:")[1]
    assert ("ERROR: The DEVRNG_SEED environment variable is 'abc', which is not a seed; set it "
            "to an int in [0, 2**64) or unset it.") in problems
    assert "TrainingRNG()" in problems
    fine = cli("doctor", env={"DEVRNG_SEED": "1234", "PL_GLOBAL_SEED": str(2**64)})
    assert fine.returncode == 1 and "PL_GLOBAL_SEED environment variable is" in fine.stdout
    assert "DEVRNG_SEED environment variable" not in fine.stdout
    clean = cli("doctor", env={"DEVRNG_SEED": "1234"})
    assert clean.returncode == 0 and "Problems in this environment" not in clean.stdout


@pytest.mark.parametrize("value", [":4096:8", ":16:8", ":0:0", ":8192:2", "4096:8"])
def test_doctor_and_deterministic_agree_on_cublas_workspace_config(
        value: str, simulate_device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor warns about exactly the values that deterministic() refuses once CUDA runs
    (SIMULATED CUDA: already initialised)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    errors, warned = environment_problems({})
    flagged = any(line.startswith(f"CUBLAS_WORKSPACE_CONFIG is {value!r}") for line in warned)
    assert not errors
    simulate_device("cuda", initialized=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ':16:8' is accepted with a warning
        try:
            with devrng.deterministic():
                refused = False
        except devrng.DevRNGError:
            refused = True
    assert flagged == refused
    assert refused == (value not in (":4096:8", ":16:8"))


def test_doctor_load_prints_what_packages_print_after_its_table(tmp_path: Path) -> None:
    """A backend package that warns while loading (Python warnings, or C++ writing to
    file descriptor 2) does not break into the table: its text comes after, marked."""
    env = install_plugin(tmp_path, "noisydev = noisy_mod:backend",
                         "import os, warnings\n"
                         "warnings.warn('noisy_mod is deprecated, says the package')\n"
                         "os.write(2, b'noisy C++ runtime: starting\\n')\n"
                         "from tests._fakes import MinimalBackend\n"
                         "backend = MinimalBackend()\nbackend.name = 'noisydev'\n")
    out = subprocess.run([sys.executable, "-m", "devrng", "doctor", "--load"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # as a terminal shows
                         env=run_env(env))
    lines = out.stdout.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.split()[:1] == ["noisydev"])
    assert "works (" in lines[table_end]
    noise = [i for i, line in enumerate(lines) if "noisy_mod is deprecated" in line
             or "noisy C++ runtime: starting" in line]
    assert len(noise) >= 2 and min(noise) > table_end, out.stdout  # the warning quotes its line
    heading = lines.index("Printed while loading the backends (by the packages themselves):")
    assert table_end < heading < min(noise)
    assert all(lines[i].startswith("  | ") for i in noise)
