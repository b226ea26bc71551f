"""Seeds: what devrng accepts as one, the one mixer it derives new seeds with, and every
derivation a training run's resume depends on.

A seed is an int in ``[0, 2**64)``. New seeds (per call of ``seeded_jit``, per
rank, per DataLoader worker) come from SplitMix64 (Steele, Lea and Flood,
2014), so every derivation in devrng shares one well-studied mixer. The
derivations from a run's seed (``rank_seed``, ``loader_seed``, ...) are named
here, once: a resumed run continues exactly only if it derives the same numbers,
so none of them may change without a new checkpoint version.
"""

from __future__ import annotations

import numbers

from devrng._base.errors import short_repr

__all__ = [
    "GAMMA",
    "MASK64",
    "SEED_VARIABLES",
    "HostKey",
    "call_seed",
    "check_counter",
    "check_seed",
    "kept_epoch_seed",
    "loader_seed",
    "mix64",
    "nth_seed",
    "portable_seed",
    "rank_seed",
    "reseed_seed",
    "sample_seed",
    "seed32",
    "seed_from_environment",
    "seed_key",
    "splitmix64",
    "worker_seeds",
]

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: odd, so i * GAMMA is injective mod 2**64
#: Where a run without a seed of its own finds one, in this order (TrainingRNG exports the first).
HostKey = tuple[int, int]  # a Threefry key: two 32-bit words, as jax.random keys hold

SEED_VARIABLES = ("DEVRNG_SEED", "PL_GLOBAL_SEED")


def check_seed(seed: object, name: str = "seed") -> int:
    """``seed`` as an int in [0, 2**64), or a TypeError / ValueError that says why not.

    Examples:
        >>> check_seed(7)
        7
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"{name} must be an int in [0, 2**64), not {short_repr(seed)} (a {type(seed).__name__})."
        )
    value = int(seed)
    if not 0 <= value <= MASK64:
        raise ValueError(f"{name}={short_repr(value)} is out of range; it must be an int in "
                         "[0, 2**64).")
    return value


def check_counter(counter: object, name: str = "counter") -> int:
    """``counter`` (how far a seed stream has gone) as an int in [0, 2**63), or a ValueError.

    Examples:
        >>> check_counter(3)
        3
    """
    if isinstance(counter, bool) or not isinstance(counter, int) or not 0 <= counter < 1 << 63:
        raise ValueError(f"{name} must be an int in [0, 2**63), not {short_repr(counter)}.")
    return counter


def seed_from_environment(variable: str, raw: str) -> int:
    """The seed that environment variable ``variable`` holds as the text ``raw``.

    Raises a ValueError that names the variable and its value and says how to fix it.

    Examples:
        >>> seed_from_environment("DEVRNG_SEED", " 1234 ")
        1234
    """
    try:
        return check_seed(int(raw.strip()), variable)
    except (TypeError, ValueError):
        raise ValueError(
            f"The {variable} environment variable is {raw!r}, which is not a seed; set it to an "
            "int in [0, 2**64) or unset it."
        ) from None


def mix64(z: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit ints that spreads every bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(x: int) -> int:
    """One SplitMix64 step from state ``x``: its output."""
    return mix64((x + GAMMA) & MASK64)


def nth_seed(seed: int, n: int) -> int:
    """Output number ``n`` (from 0) of a SplitMix64 generator started at ``mix64(seed)``.

    Mixing the start first puts neighbouring seeds far apart; for one ``seed``,
    distinct ``n`` below 2**64 never give the same value (the increment is odd
    and ``mix64`` is a bijection).

    Examples:
        >>> nth_seed(0, 0) != nth_seed(0, 1) != nth_seed(1, 0)
        True
    """
    return mix64((mix64(seed) + (n + 1) * GAMMA) & MASK64)


# -- what a run derives from its seed: one index range of nth_seed each, never shared --------
def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s generators (index ``rank``): ``devrng.distributed.rank_seed``,
    and a per-rank ``TrainingRNG``."""
    return nth_seed(seed, rank)


def call_seed(base_seed: int, counter: int) -> int:
    """The seed of call number ``counter`` (from 0) of a ``seeded_jit`` function called without
    ``seed=``, from its base seed."""
    return nth_seed(base_seed, counter)


def loader_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th DataLoader generator a run makes (index 2**32 + index)."""
    return nth_seed(seed, (1 << 32) + index)


def reseed_seed(seed: int, rank: int) -> int:
    """What a resumed rank seeds the devices its saved state has no state for with
    (index 2**33 + rank): never a stream any rank had in the saved run."""
    return nth_seed(seed, (1 << 33) + rank)


def portable_seed(seed: int) -> int:
    """The seed of a run's portable stream (``TrainingRNG.portable``; index 2**34)."""
    return nth_seed(seed, 1 << 34)


# -- what DataLoader workers derive from the seed the DataLoader gives them ---------------------
def worker_seeds(base_seed: int, worker_id: int, rank: int) -> tuple[int, int, list[int]]:
    """The torch, Python and NumPy seeds of DataLoader worker ``worker_id`` of ``rank``, from
    the seed the DataLoader draws for the epoch (``base_seed``): ``seed_worker``'s.

    Examples:
        >>> torch_seed, python_seed, numpy_words = worker_seeds(7, 0, 0)
        >>> len(numpy_words)
        4
    """
    h = splitmix64(base_seed & MASK64)
    h = splitmix64(h ^ splitmix64((rank & MASK64) ^ 0x5EED0000000000AB))
    h = splitmix64(h ^ (worker_id & MASK64))
    torch_seed = splitmix64(h ^ 1)
    python_seed = splitmix64(h ^ 2)
    np_words = [w for k in (3, 4) for x in (splitmix64(h ^ k),)
                for w in (x & 0xFFFFFFFF, x >> 32)]
    return torch_seed, python_seed, np_words


_KEPT_EPOCHS = 0x6B657074_65706F63  # mixed into the seeds of the later epochs of kept workers


def kept_epoch_seed(base_seed: int, epoch: int) -> int:
    """The seed ``sample_rng`` draws from in epoch ``epoch`` (1, 2, ...: after the first) of
    workers kept across epochs, which keep the first epoch's ``base_seed``."""
    return nth_seed(base_seed ^ _KEPT_EPOCHS, epoch)


def sample_seed(epoch_seed: int, index: int) -> int:
    """The seed of sample ``index``'s streams in ``sample_rng``, from its epoch's seed."""
    return nth_seed(epoch_seed, index)


def seed32(seed: int) -> int:
    """A seed below 2**32 that stands for ``seed`` where a library takes no more (Lightning's
    ``seed_everything``, through ``PL_GLOBAL_SEED``): ``seed`` itself when it is below 2**32,
    else the top 32 bits of ``nth_seed`` at index 2**35.

    Examples:
        >>> seed32(1234), seed32(2**40 + 7) < 2**32
        (1234, True)
    """
    return seed if seed < 1 << 32 else nth_seed(seed, 1 << 35) >> 32


def seed_key(seed: int) -> HostKey:
    """The key of a seed in [0, 2**64): ``jax.random.key(seed)``'s data (with x64 above 2**32).

    Examples:
        >>> seed_key(42)
        (0, 42)
    """
    return (seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF
