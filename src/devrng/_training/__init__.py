"""Training runs: ``TrainingRNG`` (resume and its checks), the DataLoaders and workers it
seeds and records, ``deterministic()``, and DCP checkpoint support.
"""
