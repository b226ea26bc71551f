"""Benchmarks: devrng against its peers, measured in one process, interleaved."""
