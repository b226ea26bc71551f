"""The resume matrix (API.md §10, "never silent"): every configuration resumes bitwise, or warns.

Each cell resumes, in a new process, from a checkpoint of the uninterrupted run A of its
configuration (run B), and either every resumed step's loss, every later validation loss,
the step count and the final weights equal A's bitwise and nothing warned (**exact**), or
B warned with a ``DevRNGWarning`` -- also logged on the ``"devrng"`` logger -- whose text
names the cause, and indeed differs (**warned**). Each exact cell has a control: the same
program with the trainer's own seeding and without devrng, which does not resume exactly
(**differs**), or, where the trainer alone already does, says so (**exact alone**).

Every run is a process of its own, forked from one that has only imported the trainer
(tests/integrations/_runs.py); per trainer, one program runs the A runs, one the
resumes. docs/resume.md's table is this one.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests._helpers import run_python
from tests._internals import read_record
from tests.integrations._runs import Result, check_flight, check_resumed, run, target

pytestmark = pytest.mark.slow
HAS_XLA = importlib.util.find_spec("torch_xla") is not None
PROGRAMS = {"lightning": "tests.integrations._lightning_run",
            "accelerate": "tests.integrations._accelerate_run",
            "transformers": "tests.integrations._transformers_run"}


@dataclass(frozen=True)
class Cell:
    trainer: str
    name: str  # the configuration, in the program's CONFIGS
    checkpoint: str  # under the configuration's ck/, or "first.ckpt" (a first part's)
    # "exact", "differs" (a control without devrng), "exact alone", "warned", "refused", or
    # "silent" (a control with one of devrng's fixes off, or a case devrng cannot tell at
    # load: only the flight record says so)
    expect: str
    match: str = ""  # what the warning says (a regular expression)
    changes: dict[str, Any] = field(default_factory=dict)  # at resume
    lost: int = 0  # steps the trainer drops on resume (Lightning's, on an epoch's last batch)
    ranks: int = 1  # processes of the job (started by torch.distributed.run); all compared
    flagged: str = ""  # "silent": what the flight record says, alone (a regular expression)

    @property
    def tag(self) -> str:
        return "B-" + self.checkpoint + "".join(f"-{k}{v}" for k, v in self.changes.items())

    def __str__(self) -> str:
        return f"{self.trainer}-{self.name}-{self.tag[2:]}-{self.expect.replace(' ', '-')}"


L, A, H = "lightning", "accelerate", "transformers"
CELLS = [
    # -- Lightning 2.6.6 (48 samples, batch 4, 2 workers, 2 epochs of 12 steps; see
    # _lightning_run). "stateful": StatefulDataLoader for training and validation with
    # callback.rng.dataloader_kwargs(), samples in sample_rng; "*-plain": seed_everything.
    Cell(L, "stateful", "epoch=0.ckpt", "exact"),  # ModelCheckpoint's default cadence
    Cell(L, "stateful-plain", "epoch=0.ckpt", "differs"),
    Cell(L, "stateful", "step=6.ckpt", "exact"),  # the middle of epoch 0
    Cell(L, "stateful-plain", "step=6.ckpt", "differs"),
    Cell(L, "stateful", "first.ckpt", "exact"),  # trainer.save_checkpoint after fit
    Cell(L, "stateful-plain", "first.ckpt", "differs"),
    Cell(L, "stateful", "epoch=0.ckpt", "exact", changes={"workers": 3}),  # sample_rng
    Cell(L, "stateful", "epoch=0.ckpt", "warned", r"the training loader had batch size 4 and "
         r"has 6", changes={"batch": 6}),
    # every_n_train_steps=6 lands on epoch 0's last batch: Lightning resumes in epoch 1 at
    # the loader's end-of-epoch position and drops 12 steps, devrng or not (the control)
    Cell(L, "stateful", "step=12.ckpt", "warned", r"the run ends 12 steps early \(Lightning's "
         r"behaviour", lost=12),
    Cell(L, "stateful-plain", "step=12.ckpt", "differs", lost=12),
    # the failure: torchdata's loaders without devrng's generator
    Cell(L, "stateful-nokwargs", "epoch=0.ckpt", "warned", r"the training loader is a "
         r"StatefulDataLoader without a generator.*the validation loader is a StatefulDataLoader"),
    # a torch DataLoader without devrng's kwargs (Lightning seeds its workers)
    Cell(L, "dataloader", "epoch=0.ckpt", "exact"),
    Cell(L, "dataloader-plain", "epoch=0.ckpt", "differs"),
    Cell(L, "dataloader", "step=6.ckpt", "warned", r"inside an epoch \(after batch 6 of 12\), "
         r"and the training loader is a DataLoader, which cannot restore its place"),
    Cell(L, "dataloader", "step=12.ckpt", "warned", r"after the last batch of an epoch, before "
         r"its validation"),
    # Lightning seeds these workers, not devrng, which cannot tell at load whether they draw
    # (issue 44): the flight record names the first step whose augmentation differs
    Cell(L, "dataloader", "epoch=0.ckpt", "silent", changes={"workers": 3},
         flagged=r"at step 15 \(batch 3 of its epoch from loader 'train'\): the batch's indices "
                 r"match and its content does not: randomness inside the dataset"),
    # persistent_workers=True: the callback gives kept workers each epoch's seed
    Cell(L, "persistent", "epoch=0.ckpt", "exact"),
    Cell(L, "persistent-plain", "epoch=0.ckpt", "differs"),
    Cell(L, "persistent-nosample", "epoch=0.ckpt", "warned", r"keeps its workers from epoch to "
         r"epoch.*draw each sample's randomness inside devrng.sample_rng"),
    Cell(L, "persistent-stateful", "epoch=0.ckpt", "warned", r"keeps its workers from epoch to "
         r"epoch.*set persistent_workers=False, or use a torch DataLoader"),
    # accumulate_grad_batches=2, num_workers=0 (6 optimizer steps an epoch)
    Cell(L, "accumulate", "epoch=0.ckpt", "exact"),
    Cell(L, "accumulate-plain", "epoch=0.ckpt", "differs"),
    # accumulate_grad_batches=2 with a StatefulDataLoader: trainer.save_checkpoint after batch
    # 6 (where an accumulation window ends), and after batch 5 (inside one)
    Cell(L, "stateful-accumulate", "batch6.ckpt", "exact"),
    Cell(L, "stateful-accumulate-plain", "batch6.ckpt", "differs"),
    Cell(L, "stateful-accumulate", "batch5.ckpt", "warned", r"written after batch 5 of 12, "
         r"inside a window of accumulate_grad_batches=2: the gradient of 1 batch accumulated "
         r"since the last optimizer step is not in the checkpoint"),
    # SLURM auto-requeue: a real SIGUSR1 at the end of batch 8 (hpc_ckpt_2), and inside the
    # training step of batch 4 (hpc_ckpt_1); the requeued job resumes from the newest itself
    Cell(L, "stateful", "hpc_ckpt_2.ckpt", "exact", changes={"requeued": 1}),
    Cell(L, "stateful-plain", "hpc_ckpt_2.ckpt", "differs", changes={"requeued": 1}),
    Cell(L, "stateful", "hpc_ckpt_1.ckpt", "warned", r"written during the training step of "
         r"batch 4 of 12 \(a save from a signal handler, such as Lightning's SIGUSR1 "
         r"auto-requeue"),
    # strategy="ddp" on 2 CPU processes, num_workers=1: Lightning makes the resumed epoch's
    # iterator before it sets the DistributedSampler's epoch (both ranks compared)
    Cell(L, "ddp", "epoch=0.ckpt", "exact"),
    Cell(L, "ddp-plain", "epoch=0.ckpt", "differs"),
    # issue 37. Augmentation outside sample_rng, resumed inside an epoch: new workers draw
    # other numbers (warned)
    Cell(L, "stateful-outside", "step=6.ckpt", "warned", r"the checkpoint was written inside "
         r"an epoch, and the resumed loader starts new workers.*the workers of the training "
         r"loader drew random numbers outside devrng.sample_rng"),
    # a SubsetRandomSampler, which torchdata replays to find its place: from the generators of
    # the epoch's start (exact; the control turns devrng's fix off); the loader is reloaded
    # every epoch (reload_dataloaders_every_n_epochs=1), so epoch 1's is another one
    # issue 44: a sharded IterableDataset whose workers draw outside sample_rng (torch.randperm,
    # augmentation): torchdata fast-forwards them, so they draw again what they drew (exact,
    # no warning at load)
    Cell(L, "stateful-iterable", "step=6.ckpt", "exact"),
    Cell(L, "stateful-subset", "step=6.ckpt", "exact"),
    Cell(L, "stateful-subset", "step=18.ckpt", "exact"),
    Cell(L, "stateful-subset", "epoch=0.ckpt", "exact"),
    Cell(L, "stateful-subset", "step=18.ckpt", "silent",
         changes={"fix_off": ["REPLAYED_SAMPLERS"]},
         flagged=r"at step 19 \(batch 9 of its epoch from loader 'train'\): the batch holds "
                 r"other samples \(its indices differ\): the loader's sampler shuffled"),
    # another number of workers inside an epoch: torchdata cannot, and the callback says why
    # before Lightning's teardown error (the control) hides torchdata's empty assertion
    Cell(L, "stateful", "step=6.ckpt", "refused", r"^DevRNGError: DevRNGCallback: the run could "
         r"not resume: the training loader was saved inside an epoch \(after batch 6\) with "
         r"num_workers=2 and has num_workers=0.*resume with num_workers=2",
         changes={"workers": 0}),
    Cell(L, "stateful", "step=6.ckpt", "refused", r"^DevRNGError: DevRNGCallback: the run could "
         r"not resume: .*with num_workers=2 and has num_workers=3", changes={"workers": 3}),
    Cell(L, "stateful", "step=6.ckpt", "refused", r"^RuntimeError: Please call "
         r"`iter\(combined_loader\)` first", changes={"workers": 0,
                                                    "fix_off": ["LIGHTNING_WORKER_COUNT"]}),
    # a random validation loader (also in the sanity check), loaders reloaded every epoch,
    # precision="bf16-mixed" on the CPU
    Cell(L, "extras", "epoch=0.ckpt", "exact"),
    Cell(L, "extras", "step=6.ckpt", "exact"),
    Cell(L, "extras", "step=18.ckpt", "exact"),
    # -- accelerate 1.15 (the accelerate page's loop; see _accelerate_run)
    # issue 44: noise added in the loop from a generator kept on the model (nothing saves it):
    # the record reads the batch at the model's input and names the loop and such a generator
    Cell(A, "loopnoise", "epoch1", "silent",
         flagged=r"at step 13 \(batch 1 of its epoch from loader 'loader'\): the batch's "
                 r"indices match and its content does not: randomness the batch met before the "
                 r"model's forward pass.*in the training loop.*a generator devrng does not "
                 r"track \(one kept on the dataset or the model"),
    Cell(A, "devrng", "epoch1", "exact"),  # saved after epoch 0's loop
    # accelerate's own state, not register(): the loader's own generator is not saved
    Cell(A, "unregistered", "epoch1", "differs"),
    Cell(A, "devrng", "epoch1", "exact", changes={"workers": 3}),  # sample_rng
    Cell(A, "devrng", "epoch1", "warned", r"the loader 'loader' had batch size 4 and has 6",
         changes={"batch": 6}),
    Cell(A, "devrng", "step6", "warned", r"inside an epoch \(in its loop over the loader\).*"
         r"skip_first_batches starts the epoch again"),
    Cell(A, "stateful", "epoch1", "warned", r"use_stateful_dataloader=True, which in accelerate"),
    Cell(A, "persistent", "epoch1", "warned", r"the loader 'loader' keeps its workers from "
         r"epoch to epoch"),
    Cell(A, "devrng", "epoch1", "warned", r"the loader 'loader' had num_workers=2 and has 0: "
         r"with num_workers=0", changes={"workers": 0}),
    Cell(A, "stateful", "step6", "warned", r"inside an epoch's loop, and a loader prepared with "
         r"use_stateful_dataloader=True does not come back at its saved place"),
    # use_seedable_sampler=True: the sampler shuffles by the loader's epoch count, which
    # save_state does not keep for a map-style dataset; register keeps it
    Cell(A, "seedable", "epoch1", "exact"),
    Cell(A, "seedable-alone", "epoch1", "differs"),  # set_seed, no devrng: epoch 0's order
    # gradient_accumulation_steps=2: after the epoch's loop, and inside a window (step 5)
    Cell(A, "accumulate", "epoch1", "exact"),
    Cell(A, "accumulate", "step5", "warned", r"skip_first_batches starts the epoch again.*"
         r"inside a window of gradient_accumulation_steps=2: the gradient accumulated since "
         r"the last optimizer step is not in it \(save_state keeps weights"),
    # two save/load rounds: a resumed run's own epoch-end state, resumed again (3 epochs)
    Cell(A, "epochs3", "epoch1", "exact", changes={"chain": "epoch2"}),
    # issue 37, on 2 processes (both compared): dispatch_batches, split_batches,
    # even_batches=False
    Cell(A, "dispatch", "epoch1", "exact", ranks=2),
    Cell(A, "split", "epoch1", "exact", ranks=2),
    Cell(A, "uneven", "epoch1", "exact", ranks=2),
    # -- HF Trainer, transformers 5.23 (save_steps=6; see _transformers_run)
    Cell(H, "devrng", "checkpoint-18", "exact"),  # the middle of epoch 1
    Cell(H, "plain", "checkpoint-18", "differs"),
    Cell(H, "devrng", "checkpoint-12", "exact"),  # the end of epoch 0
    Cell(H, "plain", "checkpoint-12", "exact alone"),  # rng_state.pth suffices there
    Cell(H, "workers0", "checkpoint-18", "warned", r"with dataloader_num_workers=0 their "
         r"augmentation"),
    Cell(H, "nosample", "checkpoint-18", "warned", r"skips the epoch's first batches without "
         r"loading them"),
    # (accelerate's SeedableRandomSampler, which the Trainer uses, shuffles by its epoch: the
    # kept workers change the augmentation, not the order)
    Cell(H, "persistent", "checkpoint-12", "warned", r"keeps its workers from epoch to epoch.*"
         r"so the samples' augmentation differs; "),
    # issue 37: save_steps=5 (checkpoints 5 and 15 inside epochs 0 and 1); ignore_data_skip=True
    # inside an epoch (the Trainer trains the epoch again: warned; the control turns it off)
    # and at an epoch's end (nothing to skip: exact)
    Cell(H, "save5", "checkpoint-5", "exact"),
    Cell(H, "save5", "checkpoint-15", "exact"),
    # issue 44: another data_seed inside an epoch: warned at load, and the flight record, which
    # sees step 7 differ, says so as that warning's (no second warning, of another cause)
    Cell(H, "devrng", "checkpoint-6", "warned", r"the SeedableRandomSampler of the training "
         r"loader had seed=1234 and has seed=99", changes={"data_seed": 99}),
    # issue 44: 2 -> 3 workers inside an epoch, samples in sample_rng: exact, and the Trainer's
    # workers (which devrng does not seed) leave it to the flight record, with no warning
    Cell(H, "save5", "checkpoint-5", "exact", changes={"workers": 3}),
    Cell(H, "save5-plain", "checkpoint-5", "exact alone"),  # epoch 0: set_seed's shuffle
    Cell(H, "save5-plain", "checkpoint-15", "differs"),
    Cell(H, "skipless", "checkpoint-18", "warned", r"with ignore_data_skip=True the Trainer does "
         r"not skip the batches that epoch trained on"),
    Cell(H, "skipless", "checkpoint-18", "silent", changes={"fix_off": ["IGNORE_DATA_SKIP"]},
         flagged=r"at step 19 \(batch 1 of its epoch from loader 'train'\): at the step's start "
                 r"the generator cpu differed"),
    Cell(H, "skipless", "checkpoint-12", "exact"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """trainer -> its output folder, every cell's run done (made once per trainer, on use)."""
    done: dict[str, Path] = {}

    def get(trainer: str) -> Path:
        if trainer not in done:
            done[trainer] = _run_trainer(trainer, tmp_path_factory.mktemp(trainer))
        return done[trainer]

    return get


def _run_trainer(trainer: str, out: Path) -> Path:
    required = {L: ("lightning", "torchdata"), A: ("accelerate",), H: ("transformers",)}[trainer]
    for package in required:
        pytest.importorskip(package)
    if HAS_XLA and trainer != L:  # accelerate moves to XLA even with cpu=True, and fails there
        pytest.skip(f"{trainer} picks XLA where torch_xla is installed (integrations env runs "
                    "these)")
    for ranks in sorted({c.ranks for c in CELLS if c.trainer == trainer}):
        cells = [c for c in CELLS if c.trainer == trainer and c.ranks == ranks]
        names = list(dict.fromkeys(c.name for c in cells))
        firsts = list(dict.fromkeys(c.name for c in cells if c.checkpoint == "first.ckpt"))
        launch(PROGRAMS[trainer], out, [{"mode": "A", "name": n} for n in names]
               + [{"mode": "first", "name": n} for n in firsts], ranks)
        launch(PROGRAMS[trainer], out, [
            {"mode": "B", "name": c.name, "tag": c.tag, "changes": c.changes,
             "checkpoint": str(out / c.name / (c.checkpoint if c.checkpoint == "first.ckpt"
                                               else Path("ck") / c.checkpoint))}
            for c in cells], ranks)
    return out


def launch(module: str, out: Path, jobs: list[dict[str, Any]], ranks: int) -> None:
    """Run ``jobs`` with the program ``module``: in a new process, or in ``ranks`` processes
    started by ``torch.distributed.run`` (each runs every job with the others)."""
    if ranks == 1:
        run(module, out, jobs)
        return
    proc = run_python("torch.distributed.run", module=True, timeout=1800, args=(
        "--standalone", f"--nproc-per-node={ranks}", "-m", module, str(out), json.dumps(jobs)),
        env={"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{module}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_cell(runs: Any, cell: Cell) -> None:
    out = runs(cell.trainer)
    whole = Result.read(out / cell.name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": cell.name, "tag": cell.tag}))
    if cell.lost:  # the trainer's own drop (here: all that was left of a 2-epoch run)
        assert resumed.steps == whole.steps - cell.lost
    elif cell.expect != "refused":
        assert resumed.losses, "the resumed run trained no step"
    check_resumed(whole, resumed, cell.expect, cell.match)
    check_flight(cell.expect, resumed, cell.flagged, ended=cell.checkpoint == "first.ckpt")
    path = target(out, {"mode": "B", "name": cell.name, "tag": cell.tag})
    rank1 = path.with_name(f"{path.stem}.rank1.json")
    if cell.name.startswith("ddp") or cell.ranks > 1:  # every rank resumes as expected
        other = Result.read(rank1)
        check_resumed(Result.read(out / cell.name / "A.rank1.json"), other, cell.expect,
                      cell.match)
        if cell.ranks > 1:
            assert other.samples != resumed.samples  # the ranks saw different samples
        check_flight(cell.expect, other)  # each rank's own record


@pytest.mark.parametrize(("trainer", "name", "checkpoint", "replays"), [
    (L, "ddp", "epoch=0.ckpt", False), (L, "ddp-plain", "epoch=0.ckpt", True),
    (A, "seedable", "epoch1", False), (A, "seedable-alone", "epoch1", True)])
def test_a_resumed_epoch_draws_its_own_order(runs: Any, trainer: str, name: str,
                                             checkpoint: str, replays: bool) -> None:
    """The order of samples in the resumed epoch 1: the uninterrupted run's, with devrng; epoch
    0's again, without it -- Lightning's DistributedSampler told its epoch after the iterator
    drew, accelerate's seedable sampler without its epoch count (the controls show that the
    configurations are sensitive to what devrng restores)."""
    out = runs(trainer)
    cell = Cell(trainer, name, checkpoint, "")
    whole = Result.read(out / name / "A.json")
    resumed = Result.read(target(out, {"mode": "B", "name": name, "tag": cell.tag}))
    assert whole.samples[0] != whole.samples[1]
    assert resumed.samples[0] == whole.samples[0 if replays else 1]


@pytest.mark.parametrize(("trainer", "name"), [(L, "stateful"), (H, "save5")])
def test_every_recorded_step_holds_its_batch_indices_and_place(runs: Any, trainer: str,
                                                               name: str) -> None:
    """Issue 44: Lightning's first iterator of a fit (made before on_train_start) and the loader
    a resumed HF Trainer skips the epoch's first batches with are watched too: every step of
    every run of the configuration (uninterrupted and resumed) records the indices of its
    batch and its place in the epoch."""
    records = list((runs(trainer) / name / "flight").glob("devrng-flight.rank*.jsonl"))
    assert records
    for path in records:
        attempts = read_record(str(path))["attempts"].values()
        steps = [line for attempt in attempts for line, _ in attempt["steps"].values()]
        assert len(attempts) >= 3 and len(steps) >= 48, path
        missing = [(line["s"], line.get("p")) for line in steps
                   if line.get("i") is None or not isinstance((line.get("p") or [0, None])[1], int)]
        assert missing == [], (path, missing)


@pytest.mark.parametrize("name", ["stateful", "stateful-plain"])
def test_lightning_first_parts_equal_the_whole_runs_first_epoch(runs: Any, name: str) -> None:
    """The first part (one epoch, trainer.save_checkpoint; a process of its own) equals A's
    first epoch from the first step: seeding through the callback alone -- or through
    seed_everything -- happens before the model is built."""
    out = runs(L)
    first, whole = Result.read(out / name / "first.json"), Result.read(out / name / "A.json")
    assert len(first.losses) == 12 and first.losses == whole.losses[:12]


def test_the_matrix_covers_each_trainer_both_ways() -> None:
    """Every trainer has exact cells with controls, and warned cells."""
    for trainer in (L, A, H):
        expects = {c.expect for c in CELLS if c.trainer == trainer}
        assert {"exact", "differs", "warned"} <= expects, trainer
    exact = {(c.trainer, c.checkpoint) for c in CELLS if c.expect == "exact" and not c.changes}
    controlled = {(c.trainer, c.checkpoint) for c in CELLS
                  if c.expect in ("differs", "exact alone", "silent")}
    assert exact <= controlled  # each exact cell's resume point has a control
