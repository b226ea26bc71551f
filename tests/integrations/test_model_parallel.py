"""DevRNGCallback under Lightning's ModelParallelStrategy (FSDP2, DCP checkpoints) on 2 CPU ranks.

The strategy saves the model and optimizer with torch.distributed.checkpoint and the
callbacks' state in ``meta.pt``, which rank 0 alone writes: the callback's state holds
every rank's (gathered when the checkpoint is taken), and each rank takes its own back.
Two fresh ``torchrun`` jobs of tests/integrations/_lightning_model_parallel.py: the
uninterrupted run, and the run resumed from its first epoch's checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tests._helpers import ROOT, run_env, run_torchrun

pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.slow  # two torchrun jobs of 2 ranks
PROGRAM = ROOT / "tests" / "integrations" / "_lightning_model_parallel.py"


def _launch(out: Path, mode: str) -> list[dict[str, Any]]:
    env = {**run_env(), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    results = [out / f"{mode}-{rank}.json" for rank in range(2)]
    proc = run_torchrun([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc_per_node=2", str(PROGRAM), str(out), mode], cwd=out, env=env,
                        timeout=900, finished=lambda _: all(r.exists() for r in results))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((out / f"{mode}-{rank}.json").read_text()) for rank in range(2)]


def test_each_rank_resumes_its_own_stream_under_model_parallel_strategy(tmp_path: Path) -> None:
    import devrng

    whole = _launch(tmp_path, "A")
    # The strategy reseeds every rank alike from PL_GLOBAL_SEED; the callback's setup gives
    # each rank its own stream again (rank_seed), as it seeded it when created.
    for rank in range(2):
        with devrng.fork_rng(devices=[], python=True, numpy=True):
            devrng.manual_seed(devrng.distributed.rank_seed(1234, rank))
            assert whole[rank]["fingerprint"] == devrng.get_rng_state(devices=[]).fingerprint()
    resumed = _launch(tmp_path, "B")
    half = len(whole[0]["losses"]) // 2
    # The ranks draw different dropout masks: had a rank got rank 0's state back, its
    # resumed losses would be rank 0's stream's, not its own.
    assert whole[0]["losses"][half:] != whole[1]["losses"][half:]
    for rank in range(2):
        assert resumed[rank]["losses"] == whole[rank]["losses"][half:], f"rank {rank}"
        assert resumed[rank]["warnings"] == []
    assert (tmp_path / "ck" / "epoch=0.ckpt" / "meta.pt").is_file()  # a DCP directory
