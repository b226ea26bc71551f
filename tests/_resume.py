"""A small training program that can be stopped after a checkpoint and resumed in a new process.

    python -m tests._resume SCENARIO OUT.json [--stop-after N --ckpt PATH] [--resume PATH]

Every step's loss is written to OUT.json as ``float.hex`` strings, so the tests
compare runs bitwise. ``--stop-after N`` saves a checkpoint after step N and
ends the process with ``os._exit`` (no clean-up runs, as when a job is killed);
``--resume PATH`` starts a new process from that checkpoint. Scenarios:

- ``cpu``: a shuffled DataLoader with 2 workers whose samples draw augmentation
  from torch, NumPy and Python; dropout; a ``seeded_jit(backend="eager")`` step;
  label noise drawn in the main process. Stopped at an epoch boundary, after the epoch's
  loop: a checkpoint taken inside the loop after the last batch misses the sampler's last
  draw, which a loader without workers makes only when asked for the batch after it.
- ``stateful``: the same through torchdata's ``StatefulDataLoader``, stopped in
  the middle of an epoch; samples draw inside ``devrng.sample_rng(index)``.
- ``xla``: the model on an XLA device (PJRT on the CPU), ``seeded_jit(backend=
  "torch_xla")``; ``torchax``: a functional step under ``seeded_jit(backend=
  "torchax")``.
- ``ddp``: two gloo ranks (run under torchrun), DistributedDataParallel, a
  DistributedSampler and 2 workers per rank; each rank checkpoints its own state.
- ``*-plain``: the same program without devrng, seeded the way people usually do
  (torch.manual_seed, random.seed, np.random.seed, a seeded DataLoader generator),
  which the tests show does not resume exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any

import numpy as np
import torch
from tests._datasets import Augmented, small_model
from tests._helpers import plain_state, resealed

import devrng

SEED = 1234
SAMPLES, BATCH, EPOCHS = 24, 4, 3  # SAMPLES: the size of tests._datasets.Augmented


def model_and_optimizer(device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = small_model(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
    """One training step: forward (dropout), MSE loss, backward, SGD."""
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return train_step


def resume(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer,
           rng: Any) -> tuple[int, int]:
    """Load the checkpoint into the model, optimizer and TrainingRNG; (epoch, step) to go on."""
    ckpt = torch.load(args.resume, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    rng.load_state_dict(*_dropped(args.drop, ckpt["rng"], rng))
    return ckpt["epoch"], ckpt["step"]


def checkpoint(path: str, **parts: Any) -> None:
    torch.save(parts, path)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("out")
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--ckpt")
    parser.add_argument("--resume")
    parser.add_argument("--drop", choices=["generator", "train_step", "global", "sample_rng"],
                        help="leave one piece out of the resume, to show the test would see it")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")  # one file per rank: RANK in a path is this rank
    args.out = args.out.replace("RANK", rank)
    args.ckpt = args.ckpt and args.ckpt.replace("RANK", rank)
    args.resume = args.resume and args.resume.replace("RANK", rank)
    run = {"cpu": run_loader, "stateful": run_loader, "cpu-plain": run_loader,
           "stateful-plain": run_loader, "xla": run_xla, "torchax": run_torchax,
           "ddp": run_ddp}[args.scenario]
    losses = run(args)
    with open(args.out, "w") as fh:
        json.dump(losses, fh)
    if args.scenario == "ddp":
        # Leave without the interpreter's teardown: the results are written, and gloo can abort
        # a finishing process there (pytorch/pytorch#190489; docs/known-issues.md).
        sys.stdout.flush()
        os._exit(0)


def _stop(args: argparse.Namespace, at: int, parts: Any) -> None:
    """After step ``args.stop_after``, save ``parts()`` and end the process at once."""
    if args.stop_after is not None and at == args.stop_after:
        checkpoint(args.ckpt, **parts())
        sys.stdout.flush()
        os._exit(0)


# ----------------------------------------------------------------------------- cpu / stateful
def run_loader(args: argparse.Namespace) -> list[str]:
    plain = args.scenario.endswith("-plain")
    stateful = args.scenario.startswith("stateful")
    model, opt = model_and_optimizer()
    if plain:
        torch.manual_seed(SEED)
        random.seed(SEED)
        np.random.seed(SEED)
        kwargs: dict[str, Any] = {"generator": torch.Generator().manual_seed(SEED),
                                  "worker_init_fn": _plain_worker_init}
        rng = None
    else:
        rng = devrng.TrainingRNG(SEED)
        kwargs = rng.dataloader_kwargs()
    dataset = Augmented(per_sample=stateful and not plain and args.drop != "sample_rng")
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader: Any = StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2,
                                         **kwargs)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                             num_workers=2, **kwargs)

    train_step = sgd_step(model, opt)
    step_fn: Any = train_step
    if rng is not None:
        step_fn = rng.track("train_step", devrng.seeded_jit(train_step, backend="eager"))
        if stateful:
            rng.track("loader", loader)
    start_epoch, step = 0, 0
    if args.resume:
        ckpt = torch.load(args.resume, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        if rng is not None:
            rng.load_state_dict(*_dropped(args.drop, ckpt["rng"], rng))
        else:  # what a careful user does without devrng
            torch.set_rng_state(ckpt["cpu"])
            version, internal, gauss = ckpt["python"]
            random.setstate((version, tuple(internal), gauss))
            kwargs["generator"].set_state(ckpt["generator"])
            if stateful:
                loader.load_state_dict(ckpt["loader"])
    losses = []

    def parts(epoch: int, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "epoch": epoch, "step": step}
        if rng is not None:
            out["rng"] = rng.state_dict()
        else:
            py = random.getstate()
            out.update(cpu=torch.get_rng_state(), python=[py[0], list(py[1]), py[2]],
                       generator=kwargs["generator"].get_state())
            if stateful:
                out["loader"] = loader.state_dict()
        return out

    for epoch in range(start_epoch, EPOCHS):
        for batch in loader:
            # Label noise drawn in the main process, from torch and Python.
            y = batch.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1) * 0.01 \
                + random.gauss(0, 0.01)
            losses.append(float(step_fn(batch, y)).hex())
            step += 1
            if stateful:  # resumable in the middle of an epoch
                _stop(args, step, lambda e=epoch, s=step: parts(e, s))
        if not stateful:  # a plain DataLoader resumes at epoch boundaries, after the loop
            _stop(args, step, lambda e=epoch, s=step: parts(e + 1, s))
    return losses


def _dropped(drop: str | None, saved: dict[str, Any], rng: Any) -> tuple[dict[str, Any], bool]:
    """The saved state with one piece left out (and strict=False to let that pass)."""
    if drop in (None, "sample_rng"):
        return saved, True
    saved = plain_state(saved)  # the plain state inside this rank's entry, to change a piece
    if drop == "generator":
        saved["generators"].clear()
    elif drop == "train_step":
        del saved["tracked"]["train_step"]
    else:  # "global": this process's own global generators instead of the saved ones
        saved["rng"] = plain_state(rng.state_dict())["rng"]
    return resealed(saved), False


def _plain_worker_init(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


# ----------------------------------------------------------------------------- xla
def run_xla(args: argparse.Namespace) -> list[str]:
    import torch_xla

    device = str(torch_xla.device())
    rng = devrng.TrainingRNG(SEED)
    model, opt = model_and_optimizer(device)
    loader = torch.utils.data.DataLoader(Augmented(per_sample=False), batch_size=BATCH,
                                         shuffle=True, **rng.dataloader_kwargs())

    step_fn = rng.track("train_step", devrng.seeded_jit(sgd_step(model, opt),
                                                        backend="torch_xla"))
    start_epoch, step = resume(args, model, opt, rng) if args.resume else (0, 0)
    losses = []
    for epoch in range(start_epoch, EPOCHS):
        for batch in loader:
            x = batch.to(device)
            # Noise drawn on the XLA device itself, outside the compiled step.
            y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1, device=device) * 0.01
            torch_xla.sync()
            losses.append(float(step_fn(x, y).cpu()).hex())
            step += 1
        _stop(args, step, lambda e=epoch, s=step: {
            "model": {k: v.cpu() for k, v in model.state_dict().items()},
            "optimizer": _to_cpu(opt.state_dict()), "epoch": e + 1, "step": s,
            "rng": rng.state_dict()})
    return losses


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------- torchax
def run_torchax(args: argparse.Namespace) -> list[str]:
    import torchax

    env = torchax.default_env()
    rng = devrng.TrainingRNG(SEED)
    model, _ = model_and_optimizer()  # the module gives the function; params live on jax
    with env:
        params = {k: v.detach().to("jax") for k, v in model.state_dict().items()}
    loader = torch.utils.data.DataLoader(Augmented(per_sample=False), batch_size=BATCH,
                                         shuffle=True, **rng.dataloader_kwargs())

    def loss_fn(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    def train_step(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)  # dropout inside
        return loss, {k: p[k] - 0.05 * grads[k] for k in p}

    step_fn = rng.track("train_step", devrng.seeded_jit(train_step, backend="torchax"))
    start_epoch, step = 0, 0
    if args.resume:
        ckpt = torch.load(args.resume, weights_only=True)
        with env:
            params = {k: v.to("jax") for k, v in ckpt["params"].items()}
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        rng.load_state_dict(*_dropped(args.drop, ckpt["rng"], rng))
    losses = []
    for epoch in range(start_epoch, EPOCHS):
        for batch in loader:
            with env:
                x = batch.to("jax")
                # Noise drawn from torchax's own key, outside the compiled step.
                y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1,
                                                                   device="jax") * 0.01
            loss, params = step_fn(params, x, y)
            losses.append(float(np.asarray(loss.jax())).hex())
            step += 1
        _stop(args, step, lambda e=epoch, s=step, p=params: {
            "params": {k: torch.from_numpy(np.asarray(v.jax()).copy()) for k, v in p.items()},
            "epoch": e + 1, "step": s, "rng": rng.state_dict()})
    return losses


# ----------------------------------------------------------------------------- ddp
def run_ddp(args: argparse.Namespace) -> list[str]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rng = devrng.TrainingRNG(SEED)
    model, opt = model_and_optimizer()
    ddp: Any = torch.nn.parallel.DistributedDataParallel(model)
    sampler = torch.utils.data.distributed.DistributedSampler(Augmented(), shuffle=True,
                                                              seed=SEED)
    loader = torch.utils.data.DataLoader(Augmented(), batch_size=BATCH, sampler=sampler,
                                         num_workers=2, **rng.dataloader_kwargs())

    step_fn = rng.track("train_step", devrng.seeded_jit(sgd_step(ddp, opt), backend="eager"))
    start_epoch, step = resume(args, model, opt, rng) if args.resume else (0, 0)
    losses = []
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for batch in loader:
            y = batch.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1) * 0.01
            losses.append(float(step_fn(batch, y)).hex())
            step += 1
        if args.stop_after == step:
            dist.barrier()  # both ranks have finished the epoch before either stops
        _stop(args, step, lambda e=epoch, s=step: {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": e + 1,
            "step": s, "rng": rng.state_dict()})
    dist.barrier()
    dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
