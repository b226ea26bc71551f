"""HF transformers on XLA (PJRT on the CPU), run in a fresh process per mode.

    python -m tests.integrations._hf_xla checkpoint-grads MODE   -> JSON {use_reentrant: result}
    python -m tests.integrations._hf_xla trainer MODE            -> JSON {"result": ...}

MODE ``plain`` runs without devrng, ``devrng`` with ``devrng.patch_torch()`` (the
gradients) or ``DevRNGTrainerCallback`` (the Trainer). A result is the number of
parameter gradients bitwise equal to the run without checkpointing, or the error.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import torch
import torch_xla
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import devrng
from devrng.integrations.transformers import DevRNGTrainerCallback

CONFIG = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, hidden_dropout_prob=0.3,
                    attention_probs_dropout_prob=0.3, max_position_embeddings=32)


def checkpoint_grads(mode: str) -> dict[str, Any]:
    device = torch_xla.device()
    torch.manual_seed(0)
    model = BertForSequenceClassification(CONFIG).to(device).train()
    ids = torch.randint(0, 64, (4, 16)).to(device)
    labels = torch.tensor([0, 1, 0, 1]).to(device)
    if mode == "devrng":
        devrng.patch_torch()

    def grads(reentrant: bool | None) -> dict[str, torch.Tensor]:
        if reentrant is None:
            model.gradient_checkpointing_disable()
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.zero_grad()
        devrng.manual_seed(7)  # the same dropout masks in both runs, if they are restored
        model(input_ids=ids, labels=labels).loss.backward()
        torch_xla.sync()  # one graph for every gradient, not one per .cpu() below
        return {n: p.grad.cpu().clone() for n, p in model.named_parameters()
                if p.grad is not None}

    plain = grads(None)
    out: dict[str, Any] = {"parameters": len(plain)}
    for reentrant in (True, False):
        try:
            checkpointed = grads(reentrant)
        except Exception as err:
            out[str(reentrant)] = f"{type(err).__name__}: {err}"
            continue
        out[str(reentrant)] = sum(torch.equal(plain[k], checkpointed[k]) for k in plain)
    return out


class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (16,), generator=g), "labels": torch.tensor(i % 2)}


def trainer(mode: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = BertForSequenceClassification(CONFIG)
    # The fused AdamW that transformers picks by default refuses XLA tensors (a torch
    # limit, not devrng's): the plain one runs.
    with tempfile.TemporaryDirectory() as run_dir:  # (the flight record goes there)
        args = TrainingArguments(output_dir=run_dir, max_steps=2,
                                 per_device_train_batch_size=4, gradient_checkpointing=True,
                                 report_to=[], save_strategy="no", seed=1234,
                                 optim="adamw_torch", disable_tqdm=True)
        callbacks = [DevRNGTrainerCallback()] if mode == "devrng" else []
        try:
            result = Trainer(model=model, args=args, train_dataset=Rows(),
                             callbacks=callbacks).train()
        except Exception as err:
            return {"result": f"{type(err).__name__}: {err}", "device": str(args.device)}
        return {"result": float(result.training_loss), "device": str(args.device)}


if __name__ == "__main__":
    what, mode = sys.argv[1], sys.argv[2]
    print(json.dumps(checkpoint_grads(mode) if what == "checkpoint-grads" else trainer(mode)))
