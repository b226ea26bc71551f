"""``devrng.portable``: JAX's Threefry streams drawn by torch's random ops on every device.

``rng`` is the stream and its torch-function handler, ``ops`` the table of what each random
op draws (``refusals``: the arguments torch refuses, refused first), ``devices`` the table
of which code draws it on which device, ``threefry`` the counter-based generator itself
(the bits), with ``threefry_cpu`` (the C kernel ``_threefry_kernel``) and
``threefry_xla`` drawing it fast, ``distributions`` the draws on top of the bits as
``jax.random`` makes them; ``jax`` and ``dtensor`` adapt it to torchax and DTensor.
"""
