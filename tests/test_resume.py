"""TrainingRNG's guarantee: a run stopped after a checkpoint and resumed in a fresh process
produces bitwise the same per-step losses as the uninterrupted run.

Each scenario runs ``tests/_resume.py`` three times in new processes: the whole run,
a run that checkpoints and dies with ``os._exit``, and the resumed run. Leaving one
restored piece out (``--drop``) must make the losses differ: that is what shows the
comparison would catch a gap.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HAS_TORCHDATA = importlib.util.find_spec("torchdata") is not None
HAS_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_TORCHAX = importlib.util.find_spec("torchax") is not None
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PJRT_DEVICE": "CPU",
            "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "PYTHONWARNINGS": "ignore"}


def _run(*args: str, launcher: list[str] | None = None) -> None:
    cmd = [*(launcher or [sys.executable]), "-m", "tests._resume", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def _losses(path: Path) -> list[str]:
    return list(json.loads(path.read_text()))


class Runs:
    """The whole run of a scenario and its checkpoint, made once; resumes on demand."""

    def __init__(self, scenario: str, stop_after: int, tmp: Path,
                 launcher: list[str] | None = None, ranks: tuple[int, ...] = (0,)) -> None:
        self.scenario, self.tmp, self.launcher, self.ranks = scenario, tmp, launcher, ranks
        _run(scenario, str(tmp / "full_RANK.json"), launcher=launcher)
        _run(scenario, str(tmp / "part_RANK.json"), "--stop-after", str(stop_after),
             "--ckpt", str(tmp / "ckpt_RANK.pt"), launcher=launcher)
        for rank in ranks:
            assert (tmp / f"ckpt_{rank}.pt").exists()
            assert not (tmp / f"part_{rank}.json").exists()  # it died right after the checkpoint

    def resume(self, *extra: str) -> dict[int, tuple[list[str], list[str]]]:
        """rank -> (the uninterrupted run's losses after the checkpoint, the resumed run's)."""
        tag = "_".join(e.strip("-") for e in extra) or "exact"
        _run(self.scenario, str(self.tmp / f"resumed_{tag}_RANK.json"), "--resume",
             str(self.tmp / "ckpt_RANK.pt"), *extra, launcher=self.launcher)
        out = {}
        for rank in self.ranks:
            full = _losses(self.tmp / f"full_{rank}.json")
            resumed = _losses(self.tmp / f"resumed_{tag}_{rank}.json")
            assert 0 < len(resumed) < len(full)
            out[rank] = (full[len(full) - len(resumed):], resumed)
        return out


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs("cpu", 6, tmp_path_factory.mktemp("cpu"))  # the end of epoch 1 of 3


def test_cpu_resume_at_an_epoch_boundary_is_exact(cpu_runs: Runs) -> None:
    full, resumed = cpu_runs.resume()[0]
    assert resumed == full


@pytest.mark.parametrize("drop", ["generator", "train_step", "global"])
def test_cpu_resume_without_one_piece_differs(cpu_runs: Runs, drop: str) -> None:
    full, resumed = cpu_runs.resume("--drop", drop)[0]
    assert resumed != full  # the DataLoader generator, the seeded_jit counter, the globals


@pytest.fixture(scope="module")
def stateful_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    if not HAS_TORCHDATA:
        pytest.skip("torchdata is not installed here (it is in the core environment)")
    return Runs("stateful", 8, tmp_path_factory.mktemp("stateful"))  # batch 2 of epoch 2


def test_stateful_dataloader_resume_mid_epoch_is_exact(stateful_runs: Runs) -> None:
    full, resumed = stateful_runs.resume()[0]
    assert resumed == full


def test_stateful_dataloader_without_sample_rng_differs(stateful_runs: Runs) -> None:
    full, resumed = stateful_runs.resume("--drop", "sample_rng")[0]
    assert resumed != full  # new workers start their streams afresh: augmentation differs


def test_stateful_dataloader_alone_does_not_resume_exactly(tmp_path: Path) -> None:
    if not HAS_TORCHDATA:
        pytest.skip("torchdata is not installed here (it is in the core environment)")
    runs = Runs("stateful-plain", 8, tmp_path)
    full, resumed = runs.resume()[0]
    assert resumed != full  # loader state + CPU, Python and generator states: not enough


@pytest.mark.parametrize(("scenario", "dropped"), [
    pytest.param("xla", "the XLA seed", id="xla",
                 marks=pytest.mark.skipif(not HAS_XLA, reason="needs torch_xla (the xla environment)")),
    pytest.param("torchax", "torchax's key", id="torchax",
                 marks=pytest.mark.skipif(not HAS_TORCHAX, reason="needs torchax (the xla environment)")),
])
def test_device_resume_with_its_seeded_jit_is_exact(scenario: str, dropped: str,
                                                     tmp_path: Path) -> None:
    runs = Runs(scenario, 6, tmp_path)
    full, resumed = runs.resume()[0]
    assert resumed == full
    full, resumed = runs.resume("--drop", "global")[0]
    assert resumed != full, f"{dropped} (the label noise) is part of the global state"


def test_two_rank_ddp_resume_is_exact_on_both_ranks(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    runs = Runs("ddp", 3, tmp_path, launcher=torchrun, ranks=(0, 1))
    results = runs.resume()
    for rank, (full, resumed) in results.items():
        assert resumed == full, f"rank {rank}"
    assert results[0][0] != results[1][0]  # the ranks saw different data
    for rank, (full, resumed) in runs.resume("--drop", "train_step").items():
        assert resumed != full, f"rank {rank}"  # the seeded_jit stream is part of the state
