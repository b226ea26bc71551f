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
