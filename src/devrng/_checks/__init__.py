"""The checks of a run: the flight record (what each step drew, consumed and computed),
reading and comparing records, verdicts, and the commands that launch runs to compare
(``devrng check-resume``, ``devrng check-determinism``); the op-level recorder behind
``devrng.testing.locate_divergence``.
"""
