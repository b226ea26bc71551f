"""devrng inside the trainers people use: ``devrng.integrations.<package>``.

Each module imports its trainer at the top, so importing it is what fails when
the package is missing; nothing here is imported by ``import devrng``.

- ``devrng.integrations.lightning``: a Lightning ``Callback`` whose checkpoints
  resume bitwise.
- ``devrng.integrations.accelerate``: ``TrainingRNG`` registered with an
  ``Accelerator``'s ``save_state`` / ``load_state``, per process.
- ``devrng.integrations.transformers``: a ``TrainerCallback`` for the HF
  ``Trainer``, and activation checkpointing on XLA.
"""
