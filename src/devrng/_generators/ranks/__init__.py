"""The per-rank protocol: what a devrng state is in a job of several ranks.

``protocol``: one entry per rank in a checkpoint, under a key that names the rank, with
the identity of the save that wrote it; loading one rank's entry, all ranks together
(``load_ranked``, with the object's ``Loader``). ``collectives``: the few integers and
bytes the ranks exchange for it. ``dcp_load``: the devrng values of one ``dcp.load``
call, loaded all or none. ``planner``: the DCP load planner that lets a job with more
ranks than the saved one load (imported only when asked for).
"""
