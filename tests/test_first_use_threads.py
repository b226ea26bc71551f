"""First uses of devrng from several threads at once, in fresh processes.

A module enters ``sys.modules`` before its body has run: code that found it there and
read its attributes while another thread was still importing it failed with
``AttributeError: partially initialized module`` (``seeded_jit`` reading the portable
stream, in 3 of 6 fresh processes). devrng reads modules the program may be importing
through ``devrng._base.lazy.imported``, which waits for that import to finish.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from tests._helpers import run_python
from tests._internals import imported

# Each thread waits at the barrier, then makes its role's first use; every role appears
# in several threads. Prints OK, or the first exception a thread raised.
FIRST_USES = """
import sys, threading
import torch
import devrng

ROLES = sys.argv[1].split(",")
THREADS = int(sys.argv[2])
barrier = threading.Barrier(THREADS)
errors = []


def portable():
    with devrng.portable(0):
        torch.rand(3)


def jit():
    step = devrng.seeded_jit(lambda x: torch.nn.functional.dropout(x, 0.5), backend="eager",
                             seed=0)
    step(torch.ones(4), seed=1)


def compile():  # imports dynamo while the portable threads draw
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))


def draw_while_dynamo_loads():
    with devrng.portable(1):
        for _ in range(200):
            torch.rand(2)


def run(role):
    try:
        barrier.wait()
        globals()[role]()
    except BaseException as err:
        errors.append(f"{role}: {err!r}")


threads = [threading.Thread(target=run, args=(ROLES[i % len(ROLES)],)) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("OK" if not errors else errors[0])
"""

SCENARIOS = {"portable and seeded_jit": ("portable,jit", 4),
             "portable draws while dynamo is first imported": (
                 "compile,draw_while_dynamo_loads,jit", 6)}


def _fresh_processes(roles: str, threads: int, processes: int) -> list[str]:
    outcomes = []
    for _ in range(processes):
        proc = run_python(FIRST_USES, args=(roles, str(threads)), timeout=300)
        outcomes.append(proc.stdout.strip() or proc.stderr.strip()[-500:])
    return outcomes


def test_first_use_of_portable_and_seeded_jit_from_threads_at_once() -> None:
    # 8 of 8 fresh processes failed before (reading sys.modules while the module imported).
    roles, threads = SCENARIOS["portable and seeded_jit"]
    assert _fresh_processes(roles, threads, processes=3) == ["OK"] * 3


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_first_uses_from_threads_at_once_in_30_fresh_processes(scenario: str) -> None:
    roles, threads = SCENARIOS[scenario]
    outcomes = _fresh_processes(roles, 2 * threads, processes=30)
    assert outcomes == ["OK"] * 30, sorted(set(outcomes) - {"OK"})


def test_imported_waits_for_an_import_another_thread_has_under_way(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    # A module whose body stops half way (its first name defined, its last not yet) until
    # the test has looked it up: sys.modules holds it, half made, meanwhile.
    (tmp_path / "devrng_test_slow_module.py").write_text(
        "import devrng_test_gate as gate\n"
        "first = 1\n"
        "gate.halfway.set()\n"
        "gate.release.wait(10)\n"
        "last = 2\n")
    gate = type(sys)("devrng_test_gate")
    gate.halfway, gate.release = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "devrng_test_gate", gate)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "devrng_test_slow_module", raising=False)
    importer = threading.Thread(target=__import__, args=("devrng_test_slow_module",))
    importer.start()
    try:
        assert gate.halfway.wait(10)  # type: ignore[attr-defined]
        half_made = sys.modules["devrng_test_slow_module"]
        assert not hasattr(half_made, "last")  # what a sys.modules reader would have seen
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(imported("devrng_test_slow_module")))
        reader.start()
        time.sleep(0.2)
        assert reader.is_alive()  # waiting for the import, not reading the half-made module
        gate.release.set()  # type: ignore[attr-defined]
        reader.join(10)
        assert got and getattr(got[0], "last", None) == 2
    finally:
        gate.release.set()  # type: ignore[attr-defined]
        importer.join(10)
        sys.modules.pop("devrng_test_slow_module", None)


def test_imported_never_imports_a_module_itself() -> None:
    assert "devrng_test_never_imported" not in sys.modules
    assert imported("devrng_test_never_imported") is None
    assert imported("json") is sys.modules.get("json")  # imported by now: returned as is
    sys.modules["devrng_test_blocked"] = None  # type: ignore[assignment]  # blocked by Python's rule
    try:
        assert imported("devrng_test_blocked") is None
    finally:
        del sys.modules["devrng_test_blocked"]
