"""`devrng doctor` and `devrng selftest`, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from tests._fakes import MinimalBackend, registered

from devrng.__main__ import known_problems, main


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devrng", *args], capture_output=True, text=True,
                          env={"PJRT_DEVICE": "CPU", "PATH": "/usr/bin:/bin"})


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
])
def test_known_problems_follow_installed_versions(versions: dict[str, str], needle: str) -> None:
    assert any(needle in line for line in known_problems(versions))  # type: ignore[arg-type]


def test_no_known_problems_for_a_clean_new_torch() -> None:
    assert known_problems({"torch": "2.13.0"}) == []
