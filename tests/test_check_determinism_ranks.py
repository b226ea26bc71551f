"""``devrng check-determinism`` on a data-parallel job of two ranks (DDP, gloo, CPU,
launched by torchrun as users launch it): each rank gets a verdict of its own, and the op
is located on the rank that runs it.

(Every run ends by the flight record's step limit, ``os._exit`` after the step: no rank
finalises its interpreter, so the gloo abort at exit, pytorch/pytorch#190489, that
``run_torchrun`` retries cannot happen here.)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from tests._helpers import ROOT, run_python

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "_determinism_ddp.py"
# (Located at an earlier step when the locating runs parted there first.)
LOCATED = re.compile(r"Located( at step \d+, where the runs that recorded every op parted "
                     r"first)?: forward of module module\.pool, op "
                     r"determinism_test::unordered_sum \(the ")


def check(tmp_path: Path, *flags: str) -> tuple[int, str]:
    proc = run_python("devrng", module=True, timeout=600, env={"OMP_NUM_THREADS": "1"},
                      args=("check-determinism", "--steps", "3", "--keep", str(tmp_path),
                            "--", sys.executable, "-m", "torch.distributed.run",
                            "--standalone", "--nproc-per-node=2", str(SCRIPT), *flags))
    return proc.returncode, proc.stdout + proc.stderr


def verdicts(output: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^rank (\d): (.*)$", output, re.M)}


def test_two_deterministic_ranks_pass(tmp_path: Path) -> None:
    code, output = check(tmp_path)
    assert code == 0, output
    found = verdicts(output)
    assert sorted(found) == [0, 1], output
    for rank in (0, 1):
        assert found[rank].startswith("deterministic for steps 1..3"), output
    assert sorted(os.listdir(tmp_path / "run-1" / "flight-record")) == [
        "devrng-flight.rank0.jsonl", "devrng-flight.rank1.jsonl"]


@pytest.mark.parametrize("ranks", ["1", "0,1"])
def test_the_op_is_located_on_each_rank_that_runs_it(tmp_path: Path, ranks: str) -> None:
    code, output = check(tmp_path, "--unordered-sum", ranks)
    assert code == 1, output
    found = verdicts(output)
    assert sorted(found) == [0, 1], output
    for rank in (0, 1):
        # The gradients are averaged over the ranks: both ranks' parameters differ.
        assert "the batch and every generator matched and the parameters after the step " \
               "did not" in found[rank], output
    for rank in map(int, ranks.split(",")):
        assert LOCATED.search(found[rank]), output
    if ranks == "1":
        # Rank 0 ran no nondeterministic op: the difference reached it through the gradients'
        # all-reduce, whose inputs there (rank 0's own gradients) matched.
        assert "determinism_test::unordered_sum" not in found[0], output
        assert re.search(r"Located( at step \d+, [^:]*)?: backward of no module, op "
                         r"c10d::allreduce_ \(the \d+\w\w op of the step, on cpu\): its "
                         r"inputs were equal in both runs and its outputs were not: it is a collective: its inputs were equal on "
                         r"this rank, so the difference came from another rank through it",
                         found[0]), output
