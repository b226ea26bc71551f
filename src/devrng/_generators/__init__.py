"""Torch's generators across devices: which to touch (infer, plan), how to put them back
(undo), and what is built on that -- fork_rng, snapshots and their restore, manual_seed,
patch_torch, named streams and the rank-keyed state dicts that carry them.
"""
