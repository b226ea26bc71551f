"""The ground floor: errors, seed arithmetic, files, locks, lazy imports, rank, interrupts.

Nothing here knows a device or a generator; every other package builds on it.
"""
