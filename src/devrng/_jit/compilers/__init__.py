"""Compiler glue for seeded_jit: one module per compiler, each imported on first use."""
