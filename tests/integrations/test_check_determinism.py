"""``devrng check-determinism`` on scripts that train with each trainer integration
(Lightning, accelerate, HF Trainer), wired as their docs pages say: a deterministic script
passes; a layer that sums in an order drawn from the OS is located (module and op); a
data order drawn from the OS is named as the batch indices. (The script:
``_determinism_trainers.py``; each check runs it two to four times, as processes.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from tests._helpers import ROOT, run_python

SCRIPT = ROOT / "tests" / "integrations" / "_determinism_trainers.py"
#: The qualified name of the nondeterministic layer in the model each trainer runs forward.
POOL = {"lightning": "net.pool", "accelerate": "pool", "transformers": "net.pool"}
TRAINERS = {"lightning": "lightning.pytorch", "accelerate": "accelerate",
            "transformers": "transformers"}

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is not None,
    reason="with torch_xla installed accelerate trains on XLA, where the op named can come "
           "after the cause: XLA's cases are tests/test_check_determinism_xla.py; these run "
           "in the integrations environment")]


def check(tmp_path: Path, trainer: str, *flags: str) -> tuple[int, str]:
    pytest.importorskip(TRAINERS[trainer])
    proc = run_python("devrng", module=True, timeout=600, env={
        "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        args=("check-determinism", "--steps", "3", "--keep", str(tmp_path / "runs"), "--",
              sys.executable, str(SCRIPT), "--trainer", trainer, *flags))
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_deterministic_script_passes(tmp_path: Path, trainer: str) -> None:
    code, output = check(tmp_path, trainer)
    assert code == 0, output
    assert "deterministic for steps 1..3" in output, output


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_layer_that_sums_in_a_random_order_is_located(tmp_path: Path, trainer: str) -> None:
    code, output = check(tmp_path, trainer, "--unordered-sum")
    assert code == 1, output
    step = re.search(r"the runs differ at step (\d+)", output)
    assert step is not None, output
    assert f"locating the difference in step {step[1]}" in output, output
    assert "the batch and every generator matched and the parameters after the step did " \
           "not" in output, output
    assert re.search(r"Located( at step \d+, where the runs that recorded every op parted "
                     rf"first)?: forward of module {re.escape(POOL[trainer])}, op "
                     r"determinism_test::unordered_sum", output), output


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_data_order_from_the_os_is_named(tmp_path: Path, trainer: str) -> None:
    code, output = check(tmp_path, trainer, "--shuffle", "urandom")
    assert code == 1, output
    assert "the runs differ at step 1" in output, output
    assert "the batch holds other samples (its indices differ): the loader's order comes " \
           "from a source devrng does not seed" in output, output
    assert "locating" not in output, output  # (no op-level runs for a data-order cause)
