"""``seeded_jit``: compiled functions whose seed is a runtime argument (``seeded``), with one
adapter per compiler in ``compilers``.
"""
