"""devrng.integrations.transformers with the real HF transformers.

On XLA (the xla environment, PJRT on the CPU): ``gradient_checkpointing_enable()``
fails without devrng for both ``use_reentrant`` values and matches the plain
gradients bitwise with it; the ``Trainer`` itself trains with
``gradient_checkpointing=True`` only with ``DevRNGTrainerCallback``. On the CPU (the
integrations environment): the callback patches torch and leaves the Trainer's own
seeding alone. Models are built from a small ``BertConfig``; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
HAS_XLA = importlib.util.find_spec("torch_xla") is not None
needs_xla = pytest.mark.skipif(not HAS_XLA, reason="needs torch_xla (the xla environment)")


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated TrainingArguments keep the run (and the flight record, on by default) in
    the current directory: each test's own, removed with it, not a folder left in /tmp."""
    monkeypatch.chdir(tmp_path)


def _xla_run(*args: str) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PJRT_DEVICE": "CPU",
           "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "PYTHONWARNINGS": "ignore",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "tests.integrations._hf_xla", *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@needs_xla
@pytest.mark.slow
def test_gradient_checkpointing_on_xla_needs_devrng_and_then_matches_bitwise() -> None:
    plain = _xla_run("checkpoint-grads", "plain")
    for reentrant in ("True", "False"):
        assert "module 'torch' has no attribute 'xla'" in plain[reentrant], plain
    fixed = _xla_run("checkpoint-grads", "devrng")
    assert fixed["parameters"] > 30
    for reentrant in ("True", "False"):
        assert fixed[reentrant] == fixed["parameters"], fixed  # every gradient, bitwise


@needs_xla
@pytest.mark.slow
def test_the_trainer_checkpoints_activations_on_xla_with_the_callback() -> None:
    plain = _xla_run("trainer", "plain")
    assert "module 'torch' has no attribute 'xla'" in str(plain["result"]), plain
    fixed = _xla_run("trainer", "devrng")
    assert fixed["device"].startswith("xla"), fixed
    assert isinstance(fixed["result"], float), fixed


@pytest.mark.skipif(HAS_XLA, reason="with torch_xla installed the Trainer picks XLA (tested above)")
def test_the_callback_patches_torch_and_keeps_the_cpu_stream(tmp_path: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    import devrng
    from devrng.integrations.transformers import DevRNGTrainerCallback

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.3,
                        max_position_embeddings=32)

    class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 64, (16,), generator=g),
                    "labels": torch.tensor(i % 2)}

    def train(callbacks: list[Any]) -> float:
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, use_cpu=True,
                                 per_device_train_batch_size=4, gradient_checkpointing=True,
                                 report_to=[], save_strategy="no", seed=1234,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=callbacks)
        if callbacks:
            assert torch.random.fork_rng is devrng.fork_rng  # patched when built
        return float(trainer.train().training_loss)

    try:
        plain = train([])
        with_devrng = train([DevRNGTrainerCallback()])
    finally:
        devrng.unpatch_torch()
    assert plain == with_devrng  # on the CPU it changes nothing the Trainer draws


# -- what DevRNGTrainerCallback says when a run resumes (the Trainer's calls, in this process) -
def _args(world_size: int = 1) -> Any:
    import types

    # (output_dir: where the flight record, on by default, is kept: the test's own folder)
    return types.SimpleNamespace(seed=1, world_size=world_size, gradient_accumulation_steps=1,
                                 ignore_data_skip=False, output_dir=os.getcwd())


def _state(global_step: int, saved: dict[str, Any] | None) -> Any:
    """The TrainerState the Trainer passes: ``saved``, the callback's attributes, as it loaded
    them from the checkpoint's trainer_state.json."""
    import types

    stateful = {} if saved is None else {"DevRNGTrainerCallback": {"args": {},
                                                                   "attributes": saved}}
    return types.SimpleNamespace(global_step=global_step, stateful_callbacks=stateful)


def _resume_with(callback: Any, saved: dict[str, Any] | None, loader: Any, *,
                 global_step: int = 6, world_size: int = 1) -> list[str]:
    """Call on_train_begin as the Trainer does when it resumes; the DevRNGWarnings."""
    import warnings

    import devrng

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_train_begin(_args(world_size), _state(global_step, saved), None,
                                train_dataloader=loader)
    return [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)]


def _loader(batch: int = 4, workers: int = 2) -> Any:
    import torch

    return torch.utils.data.DataLoader(range(48), batch_size=batch, num_workers=workers)


def _saved_by(callback: Any) -> dict[str, Any]:
    """What the Trainer writes for ``callback`` after a first run began with ``_loader()``."""
    callback.on_train_begin(_args(), _state(0, None), None, train_dataloader=_loader())
    callback.on_epoch_begin(None, None, None)
    return dict(callback.state()["attributes"])


def test_the_trainer_callback_names_what_a_resume_changes() -> None:
    from devrng.integrations.transformers import DevRNGTrainerCallback

    callback = DevRNGTrainerCallback(sample_rng=True)
    saved = _saved_by(callback)
    assert _resume_with(callback, saved, _loader()) == []  # inside epoch 0, workers, sample_rng
    assert _resume_with(callback, saved, _loader(), global_step=12) == []  # an epoch's end
    [message] = _resume_with(callback, saved, _loader(batch=6))
    assert "the training loader had batch size 4 and has 6" in message
    [message] = _resume_with(callback, saved, _loader(), world_size=2)
    assert "written by a run of 1 process(es) and this run has 2" in message
    [message] = _resume_with(callback, saved, _loader(workers=0))
    assert "had num_workers=2 and has 0" in message
    assert "with dataloader_num_workers=0 their augmentation" in message
    [message] = _resume_with(DevRNGTrainerCallback(), saved, _loader())
    assert "skips the epoch's first batches without loading them" in message
    legacy = _unsealed(saved)
    assert _resume_with(callback, legacy, _loader()) == []  # devrng 0.4.0's unsealed state
    for unreadable in ({**legacy, "epoch_start": "not base64"}, None):
        [message] = _resume_with(callback, unreadable, _loader())
        assert "holds no readable state of DevRNGTrainerCallback" in message


def _unsealed(saved: dict[str, Any]) -> dict[str, Any]:
    """The attributes devrng 0.4.0 wrote for the state ``saved`` (its fields, unsealed)."""
    return {key: value for key, value in saved["devrng_state"].items()
            if key in ("epoch_start", "loader", "world_size", "flight", "saved")}


def test_every_changed_character_of_the_callback_state_is_refused_before_anything_is_applied(
        ) -> None:
    """Simulated Trainer calls: a character changed anywhere in the sealed state's texts
    raises DevRNGError from on_train_begin, with torch's generator and the callback as they
    were (devrng 0.4.0 applied 6 of 6 such changes as other generator states)."""
    import torch

    from devrng import DevRNGError
    from devrng.integrations.transformers import DevRNGTrainerCallback

    saved = _saved_by(DevRNGTrainerCallback(sample_rng=True))
    sealed = saved["devrng_state"]
    tried = 0
    for key in ("epoch_start", "saved", "flight"):
        text = sealed[key]
        for at in range(0, len(text), max(len(text) // 40, 1)):
            changed = text[:at] + ("B" if text[at] != "B" else "C") + text[at + 1:]
            callback = DevRNGTrainerCallback(sample_rng=True, flight_record=False)
            before = torch.get_rng_state()
            with pytest.raises(DevRNGError, match=r"altered or damaged after devrng .* wrote it"):
                _resume_with(callback, {"devrng_state": {**sealed, key: changed}}, _loader(),
                             global_step=3)
            assert torch.equal(torch.get_rng_state(), before)
            assert callback.loader is None and callback._resumed_epoch_start is None
            tried += 1
    assert tried > 80


def test_the_trainer_callback_puts_back_the_epochs_start_when_it_resumes_inside_it() -> None:
    import torch

    from devrng.integrations.transformers import DevRNGTrainerCallback

    torch.manual_seed(5)
    saved = _saved_by(DevRNGTrainerCallback(sample_rng=True))  # the epoch starts here
    expected = torch.rand(4)
    resumed = DevRNGTrainerCallback(sample_rng=True)
    torch.manual_seed(99)  # the resumed process is elsewhere
    assert _resume_with(resumed, saved, _loader(), global_step=18) == []
    resumed.on_epoch_begin(None, None, None)
    assert torch.equal(torch.rand(4), expected)  # what the resumed epoch's iterator draws from


# -- a dataset without a length, and the callback's state in trainer_state.json (a real Trainer)
def _stream_run(output_dir: Path, resume: Path | None = None, *, workers: int = 2,
                restore: bool = False) -> tuple[list[str], list[str], int]:
    """A Trainer with DevRNGTrainerCallback on ``tests._datasets.Streamed`` (an
    IterableDataset without ``__len__``) for max_steps=6, saving every 3 steps: each trained
    step's loss (``float.hex``), the DevRNGWarnings, the global step reached."""
    import warnings

    import torch
    from tests._datasets import Streamed
    from tests.integrations._transformers_run import Model
    from transformers import Trainer, TrainingArguments, set_seed

    import devrng
    from devrng.integrations.transformers import DevRNGTrainerCallback

    class Rows(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
        def __iter__(self) -> Any:
            for x in Streamed():
                yield {"x": x, "labels": x.sum(dim=0, keepdim=True) * 0.5}

    set_seed(1234)
    model = Model()
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=6,
        save_strategy="steps", save_steps=3, seed=1234, use_cpu=True, report_to=[],
        disable_tqdm=True, logging_strategy="no", dataloader_num_workers=workers,
        remove_unused_columns=False, optim="sgd", learning_rate=0.05,
        lr_scheduler_type="constant", max_grad_norm=0.0,
        restore_callback_states_from_checkpoint=restore)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(),
                      callbacks=[DevRNGTrainerCallback()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
        finally:
            devrng.unpatch_torch()
    said = [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)]
    return model.losses, said, trainer.state.global_step


@pytest.mark.skipif(HAS_XLA, reason="with torch_xla installed the Trainer picks XLA")
@pytest.mark.parametrize("restore", [False, True],
                         ids=["callback kept", "restore_callback_states_from_checkpoint"])
def test_a_dataset_without_a_length_resumes_exactly_with_the_callback(tmp_path: Path,
                                                                      restore: bool) -> None:
    """A streaming dataset (no __len__, max_steps), workers drawing each sample's
    augmentation: the resume from the step-3 checkpoint continues the uninterrupted run
    bitwise, without a warning (the Trainer loads the skipped batches of such a loader, so the
    workers' streams are replayed). The callback took len() of the loader (TypeError), and
    under restore_callback_states_from_checkpoint=True used its saved "flight" text as the
    flight record (AttributeError)."""
    whole, said, steps = _stream_run(tmp_path / "run", restore=restore)
    assert (len(whole), said, steps) == (6, [], 6)
    resumed, said, steps = _stream_run(tmp_path / "run", tmp_path / "run" / "checkpoint-3",
                                       restore=restore)
    assert said == [] and steps == 6
    assert resumed == whole[3:]


def _flipped(text: str, at: int) -> str:
    """``text`` with the base64 character at ``at`` changed to another one."""
    return text[:at] + ("B" if text[at] != "B" else "C") + text[at + 1:]


_CHANGES: dict[str, Any] = {
    "epoch_start": lambda s: {**s, "epoch_start": _flipped(s["epoch_start"], 700)},
    "saved": lambda s: {**s, "saved": _flipped(s["saved"], 40)},
    "loader": lambda s: {**s, "loader": {**s["loader"], "batch_size": 5}},
    "world_size": lambda s: {**s, "world_size": 2},
    "flight": lambda s: {**s, "flight": "00000000:3"},
    "a key": lambda s: {("savee" if k == "saved" else k): v for k, v in s.items()},
}


@pytest.mark.skipif(HAS_XLA, reason="with torch_xla installed the Trainer picks XLA")
def test_a_changed_callback_state_in_trainer_state_json_is_refused(tmp_path: Path) -> None:
    """Each change to the callback's entry in trainer_state.json (a flipped character of a
    generator state that still decodes to a valid one, another loader, world size or flight
    key, a renamed key) is refused with a DevRNGError before the resumed run trains a step;
    the intact checkpoint resumes."""
    import base64
    import shutil

    import torch

    from devrng import DevRNGError

    _stream_run(tmp_path / "run", workers=0)
    checkpoint = tmp_path / "run" / "checkpoint-3"
    state_file = checkpoint / "trainer_state.json"
    intact = json.loads(state_file.read_text())
    entry = intact["stateful_callbacks"]["DevRNGTrainerCallback"]
    sealed = entry["attributes"]["devrng_state"]
    cases = {name: {"devrng_state": change(sealed)} for name, change in _CHANGES.items()}
    cases["the attribute's name"] = {"devrng_statf": sealed}
    for name, attributes in cases.items():
        changed = tmp_path / name / "checkpoint-3"
        shutil.copytree(checkpoint, changed)
        data = json.loads(json.dumps(intact))
        data["stateful_callbacks"]["DevRNGTrainerCallback"]["attributes"] = attributes
        (changed / "trainer_state.json").write_text(json.dumps(data))
        for key in ("epoch_start", "saved"):  # each still a state torch takes
            text = attributes.get("devrng_state", {}).get(key)
            if text is not None:
                raw = bytearray(base64.b64decode(text))
                torch.Generator().set_state(torch.frombuffer(raw, dtype=torch.uint8))
        with pytest.raises(DevRNGError, match=r"DevRNGTrainerCallback: the checkpoint's "
                                              r"trainer_state.json .*(altered or damaged "
                                              r"after).*(none of it is loaded)") as caught:
            _stream_run(tmp_path / name, changed, workers=0)
        # (raised as training begins: before the callback restores a generator or a step runs)
        callback_frames = [entry.name for entry in caught.traceback
                           if Path(entry.path).name == "transformers.py"
                           and Path(entry.path).parent.name == "integrations"]
        assert callback_frames == ["on_train_begin", "_saved"], name
    resumed, _, steps = _stream_run(tmp_path / "run", checkpoint, workers=0)
    assert steps == 6 and len(resumed) == 3


@pytest.mark.skipif(HAS_XLA, reason="with torch_xla installed the Trainer picks XLA")
@pytest.mark.parametrize("restore", [False, True],
                         ids=["callback kept", "restore_callback_states_from_checkpoint"])
def test_a_checkpoint_written_by_devrng_0_4_still_resumes(tmp_path: Path, restore: bool) -> None:
    """devrng 0.4.0 wrote the callback's fields as attributes of their own, unsealed (and
    args without flight_record): such a checkpoint resumes as before, exactly, also when the
    Trainer sets those attributes on a new callback (its "flight" text was taken for the
    flight record: AttributeError)."""
    whole, _, _ = _stream_run(tmp_path / "run")
    state_file = tmp_path / "run" / "checkpoint-3" / "trainer_state.json"
    data = json.loads(state_file.read_text())
    entry = data["stateful_callbacks"]["DevRNGTrainerCallback"]
    entry["attributes"] = _unsealed(entry["attributes"])
    entry["args"] = {"sample_rng": entry["args"]["sample_rng"]}
    state_file.write_text(json.dumps(data))
    resumed, said, steps = _stream_run(tmp_path / "run", state_file.parent, restore=restore)
    assert (resumed, said, steps) == (whole[3:], [], 6)
