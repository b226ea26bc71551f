"""The state of a training run: ``TrainingRNG`` (save, load, resume), the DataLoaders and
workers it seeds, ``deterministic()``, and DCP checkpoint support. Its checks (the flight
record, ``check-resume``) are ``devrng._checks``.
"""
