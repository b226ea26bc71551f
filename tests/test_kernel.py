"""The portable streams' CPU kernel: built at install time, proven on load, never loaded from a cache.

The kernel is the C extension ``devrng._portable._threefry_kernel`` that ``pip install`` compiles.
These tests build real wheels with and without a compiler, plant libraries where an old
devrng cached its kernel, and compile damaged kernels (a wrong rotation, a missing entry
point, a truncated file) that devrng must refuse, each in a fresh interpreter.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from tests import _threefry_ref as ref
from tests._helpers import ROOT, run_python
from tests._internals import (
    BITS,
    DTYPES,
    EXPONENTIAL,
    KERNEL_LOADER,
    KERNEL_MODULE,
    NORMAL,
    NORMAL_AT,
    NORMAL_BF16,
    NORMAL_BF16_AT,
    NORMAL_F16,
    NORMAL_F16_AT,
    PARALLEL_FROM,
    PROOF_DIGEST,
    PROOF_FILLS,
    PROOF_KEY,
    PROOF_LENGTH,
    PROOF_RANDINTS,
    PROOF_SPLIT,
    UNIFORM,
    UNIFORM64,
    UNIFORM64_AT,
    UNIFORM_AT,
    UNIFORM_BF16_AT,
    UNIFORM_F16_AT,
    UNIT_BF16,
    UNIT_F16,
    WORDS,
    distributions,
    jax_multiplier,
    kernel,
    proof_counters,
    proof_digest,
    proof_draw_counters,
    sorts_stably,
    status,
    switched_off,
    threefry,
)
from tests._kernel_flips import running_code, sample_flips

from devrng import DevRNGError

SOURCE = ROOT / "src" / "devrng" / "_portable" / "_threefry_kernel.c"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
# What the build names the kernel: one library for every CPython (the limited API, abi3).
ABI3 = ".pyd" if sys.platform == "win32" else ".abi3.so"
# What a child prints: whether the kernel is used, doctor's sentence, and a portable draw.
PROBE = f"""
import torch, devrng
from {KERNEL_LOADER} import status
with devrng.portable(1):
    drawn = torch.rand(5).tolist()
print(status()[0], repr(status()[1]), drawn, sep="\\n")
"""


def _probe(env: dict[str, str | None] | None = None, prelude: str = "") -> list[str]:
    out = run_python(prelude + PROBE, env=env)
    assert out.returncode == 0, out.stderr
    assert "DevRNGWarning" not in out.stderr  # a kernel switched off or absent is no surprise
    return out.stdout.strip().splitlines()


def _want() -> str:
    return str(ref.uniform(ref.stream_key(1, 0), (5,)).tolist())


def test_the_installed_kernel_is_in_use_and_equals_the_reference_in_every_mode() -> None:
    # CI installs devrng with a compiler: the extension must be there and pass its check.
    in_use, why = status()
    assert in_use, why
    assert "compiled at install time" in why
    cpu = kernel()
    assert cpu is not None
    rng = np.random.default_rng(0)
    for _ in range(5):
        key = (int(rng.integers(0, 2**32)), int(rng.integers(0, 2**32)))
        start = int(rng.integers(0, 2**63))
        counters = rng.integers(0, 2**63, size=37, dtype=np.int64)
        bits = torch.empty(37, dtype=torch.int32)
        cpu.run(key, BITS, bits, counters=torch.from_numpy(counters))
        assert np.array_equal(bits.numpy().view(np.uint32),
                              ref.bits(key, (37,), counters.astype(np.uint64)))
        words = torch.empty(2, 37, dtype=torch.int32)
        cpu.run(key, WORDS, words[0], words[1], start=start)
        counter = np.uint64(start) + np.arange(37, dtype=np.uint64)
        x0, x1 = ref.threefry2x32(key, counter >> np.uint64(32), counter & np.uint64(ref.M32))
        assert np.array_equal(words.numpy().view(np.uint32), np.stack([x0, x1]))
        uniform = torch.empty(37, dtype=torch.float32)
        cpu.run(key, UNIFORM, uniform, start=0)
        assert np.array_equal(uniform.numpy(), ref.uniform(key, (37,)))
        wide = torch.empty(37, dtype=torch.float64)
        cpu.run(key, UNIFORM64, wide, start=start)
        bits64 = (x0.astype(np.uint64) << np.uint64(32)) | x1.astype(np.uint64)
        assert np.array_equal(wide.numpy(), (bits64 >> np.uint64(12)).astype(np.float64) * 2.0**-52)


def _tensor_ops(key: tuple[int, int], counters: torch.Tensor) -> distributions.Source:
    """A source drawing with the tensor ops (its key a tensor: no kernel), at ``counters``."""
    return distributions.Source(threefry.key_tensor(key), torch.device("cpu"), counters)


def test_the_kernels_float_and_integer_draws_are_the_tensor_ops_bit_for_bit() -> None:
    # The transforms (normal, exponential, float64 uniforms, randint) against devrng's tensor
    # ops, which other devices run: 2**16 draws per key, so every branch (erfinv's tails,
    # randint's spans above and below 2**16) is hit many times.
    cpu = kernel()
    assert cpu is not None
    n = 1 << 16
    for key, start in (((0, 0), 0), ((0x9E3779B9, 0x7F4A7C15), (1 << 32) - n // 2)):
        counters = torch.arange(start, start + n)
        ops = _tensor_ops(key, counters)
        # uniform_(-0.3, 0.7) scales by float32(1.0) from float32(-0.3); normal_(0.5, 0.02).
        low = distributions.round_to(-0.3, torch.float32)
        span = distributions.round_to(distributions.round_to(0.7, torch.float32) - low, torch.float32)
        for mode, scale, shift, want in (
                (NORMAL, 1.0, 0.0, distributions.normal(ops, (n,), torch.float32)),
                (EXPONENTIAL, 1.0, 0.0, distributions.exponential(ops, (n,), torch.float32)),
                (UNIFORM64, 1.0, 0.0, distributions.unit(ops, (n,), torch.float64)),
                (UNIFORM_AT, span, low, distributions.uniform(ops, (n,), torch.float32, -0.3, 0.7)),
                (NORMAL_AT, 0.02, 0.5, distributions.normal(ops, (n,), torch.float32, 0.5, 0.02))):
            got = torch.empty(n, dtype=want.dtype)
            cpu.run(key, mode, got, start=start, scale=scale, shift=shift)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), mode
        for low, high in ((0, 10), (-5, 1000), (0, 65536), (3, 65539), (-2**31, 2**31 - 1)):
            want = distributions.randint(ops, (n,), low, high, torch.int64)
            span = high - low
            multiplier = ((((1 << 16) % span) ** 2) & 0xFFFFFFFF) % span
            for dtype in (torch.int64, torch.int32):
                got = torch.empty(n, dtype=dtype)
                cpu.randint((threefry.fold_in(key, 0), threefry.fold_in(key, 1)), span, multiplier, low, got,
                            counters=counters)
                assert torch.equal(got.to(torch.int64), want), (low, high, dtype)


# Bounds for the float64 and half draws: spans with and without an exact product, a power of
# two, negative and positive ranges; (mean, std) pairs whose scaled half draws land on
# float32 numbers halfway between two half ones (std 1 + 2**-11 + 2**-40: torch rounds the
# float64 result to float32 first, then to the half type, and so does the kernel).
_BOUNDS = ((-0.1, 0.1), (0.0, 0.5), (-3.7, 1.3), (1e-3, 1e-3 + 2**-10), (-1e3, -1e3 + 0.375),
           (1.0 / 3, 7.25), (-2**-20, 2**-20), (-1.0, 1.0))
_SCALES = ((0.5, 0.02), (-3.0, 3.0), (0.0, 1.0 + 2**-11 + 2**-40), (1e4, 1e-3), (0.1, 100.0))


def test_the_kernels_float64_and_half_draws_are_the_tensor_ops_for_many_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = kernel()
    assert cpu is not None
    modes: list[int] = []
    run = type(cpu).run

    def counted(self: object, key: object, mode: int, *args: object, **kwargs: object) -> None:
        modes.append(mode)
        run(self, key, mode, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(cpu), "run", counted)
    n = 1 << 13
    for i, dtype in enumerate((torch.float64, torch.float16, torch.bfloat16)):
        key, start = (0x9E3779B9 + i, 0x7F4A7C15), (1 << 32) - n // 2
        counters = torch.arange(start, start + n)
        ops = _tensor_ops(key, counters)
        fused = distributions.Source(key, torch.device("cpu"), counters)
        draws: list[Callable[[distributions.Source], torch.Tensor]] = [
            lambda s, d=dtype: distributions.unit(s, (n,), d),
            lambda s, d=dtype: distributions.normal(s, (n,), d)]
        draws += [lambda s, b=b, d=dtype: distributions.uniform(s, (n,), d, *b) for b in _BOUNDS]
        draws += [lambda s, m=m, d=dtype: distributions.normal(s, (n,), d, *m) for m in _SCALES]
        for j, draw in enumerate(draws):
            want = draw(ops)
            before = len(modes)
            got = draw(fused)
            assert len(modes) == before + 1, (dtype, j)  # one call of the kernel
            assert got.dtype == dtype
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, j)
    # Among them the kernel's float64 and half modes.
    assert {UNIFORM64_AT, *_HALF_DRAWS[torch.float16], *_HALF_DRAWS[torch.bfloat16]} <= set(modes)


def _signed(counters: Sequence[int]) -> torch.Tensor:
    """The proof's uint64 counters as the int64 tensor the tensor ops read."""
    return torch.tensor([c - (1 << 64) if c >> 63 else c for c in counters], dtype=torch.int64)


# The modes that draw normals (the proof must reach erfinv's tails in each).
_NORMAL_MODES = (NORMAL, NORMAL_AT, NORMAL_F16, NORMAL_BF16, NORMAL_F16_AT, NORMAL_BF16_AT)
# The half types' modes: unit, uniform between bounds, standard normal, normal(mean, std).
_HALF_DRAWS = {torch.float16: (UNIT_F16, UNIFORM_F16_AT, NORMAL_F16, NORMAL_F16_AT),
               torch.bfloat16: (UNIT_BF16, UNIFORM_BF16_AT, NORMAL_BF16, NORMAL_BF16_AT)}


def _tensor_ops_draws() -> tuple[Callable[..., list[bytes]], Callable[..., bytes]]:
    """The proof's fill and randint (kernel_proof.proof_digest) made by the tensor ops."""
    def fill(mode: int, scale: float, shift: float, counters: Sequence[int], _: bool
             ) -> list[bytes]:
        ops, shape = _tensor_ops(PROOF_KEY, _signed(counters)), (len(counters),)
        draws = {BITS: lambda: [ops.bits(shape)], WORDS: lambda: list(ops.words(shape)),
                 UNIFORM: lambda: [distributions.unit(ops, shape, torch.float32)],
                 UNIFORM64: lambda: [distributions.unit(ops, shape, torch.float64)],
                 NORMAL: lambda: [distributions.normal(ops, shape, torch.float32)],
                 EXPONENTIAL: lambda: [distributions.exponential(ops, shape, torch.float32)],
                 UNIFORM_AT: lambda: [distributions.uniform(ops, shape, torch.float32, shift,
                                                       shift + scale)],
                 NORMAL_AT: lambda: [distributions.normal(ops, shape, torch.float32, shift, scale)],
                 UNIFORM64_AT: lambda: [distributions.uniform(ops, shape, torch.float64, shift,
                                                         shift + scale)]}
        for dtype, modes in _HALF_DRAWS.items():
            unit, uniform, standard, normal = modes
            draws[unit] = lambda dtype=dtype: [distributions.unit(ops, shape, dtype)]
            draws[uniform] = lambda dtype=dtype: [distributions.uniform(ops, shape, dtype, shift,
                                                                        shift + scale)]
            draws[standard] = lambda dtype=dtype: [distributions.normal(ops, shape, dtype)]
            draws[normal] = lambda dtype=dtype: [distributions.normal(ops, shape, dtype, shift,
                                                                      scale)]
        return [t.contiguous().view(torch.uint8).numpy().tobytes() for t in draws[mode]()]

    def randint(span: int, low: int, wide: bool, counters: Sequence[int], _: bool) -> bytes:
        ops = _tensor_ops(PROOF_KEY, _signed(counters))
        out = distributions.randint(ops, (len(counters),), low, low + span,
                               torch.int64 if wide else torch.int32)
        return out.contiguous().view(torch.uint8).numpy().tobytes()

    return fill, randint


@pytest.mark.slow
def test_randint_is_jaxs_uint32_arithmetic_for_every_span_up_to_2_17() -> None:
    # The kernel reduces the spans with a non-zero multiplier (3 to 2**16 - 1) in one step
    # in double, the others with 32-bit integers; JAX computes in uint32. Every span, on a
    # whole block and a partial one, against NumPy's uint32 arithmetic on NumPy's bits.
    cpu = kernel()
    assert cpu is not None
    keys = ((0x12345678, 0x9ABCDEF0), (0xFFFFFFFF, 0x0BADF00D))
    n, start = 256 + 37, (1 << 32) - 100
    counters = np.uint64(start) + np.arange(n, dtype=np.uint64)
    higher, lower = (ref.bits(k, (n,), counters).astype(np.uint64) for k in keys)
    got = torch.empty(n, dtype=torch.int64)
    for span in range(1, 1 << 17):
        multiplier = jax_multiplier(span)
        cpu.randint(keys, span, multiplier, -1, got, start=start)
        offset = (((higher % span) * multiplier) & 0xFFFFFFFF) + lower % span
        want = ((offset & 0xFFFFFFFF) % span).astype(np.int64) - 1
        assert np.array_equal(got.numpy(), want), span


def test_the_proof_digest_is_the_tensor_ops_draws() -> None:
    # The digest the kernel must reproduce before first use comes from the tensor ops, and
    # randint's two keys are split(PROOF_KEY)'s.
    assert proof_digest(*_tensor_ops_draws()) == PROOF_DIGEST
    assert (threefry.fold_in(PROOF_KEY, 0), threefry.fold_in(PROOF_KEY, 1)) == PROOF_SPLIT


def test_the_proof_runs_every_mode_block_shape_and_branch_of_the_kernel() -> None:
    block = int(re.findall(r"#define NB (\d+)", SOURCE.read_text())[0])
    # Whole blocks, then a partial one of all but one element (computed whole in scratch).
    assert block < PROOF_LENGTH and PROOF_LENGTH % block == block - 1
    # Every draw from a start crosses a carry into the high word inside one of its blocks.
    draws = len(PROOF_FILLS) + len(PROOF_RANDINTS)
    for i in range(draws):
        high = [c >> 32 for c in proof_draw_counters(i, PROOF_LENGTH, True)]
        carry = next(k for k, h in enumerate(high) if h != high[0])
        assert carry % block and high[0] not in (0, 0xFFFFFFFF)
    # Scattered counters: high and low words, negative and positive as int64 values.
    counters = proof_counters()
    assert len({c >> 32 for c in counters}) == PROOF_LENGTH
    assert {c >> 63 for c in counters} == {0, 1}
    # Every mode and output dtype; randint's range reductions in both widths.
    assert {mode for mode, _, _ in PROOF_FILLS} == set(DTYPES)
    # The float64 uniform's exact product, and its power-of-two span (a plain product).
    assert {math.frexp(span)[0] == 0.5 for mode, span, _ in PROOF_FILLS
            if mode == UNIFORM64_AT} == {True, False}
    assert {jax_multiplier(span) == 0 for span, _, _ in PROOF_RANDINTS} == {True, False}
    assert 1 in {span for span, _, _ in PROOF_RANDINTS}
    assert {wide for _, _, wide in PROOF_RANDINTS} == {True, False}  # int64 and int32
    # The normal draws reach erfinv's tails (w >= 5) from a start and from counters.
    lo = -1.0 + 2.0 ** -24
    for i, (mode, _, _) in enumerate(PROOF_FILLS):
        for from_start in (True, False) if mode in _NORMAL_MODES else ():
            ops = _tensor_ops(PROOF_KEY, _signed(proof_draw_counters(i, PROOF_LENGTH,
                                                                     from_start)))
            u = distributions.uniform(ops, (PROOF_LENGTH,), torch.float32, lo, 1.0)
            w = -distributions.log32((1.0 - u) * (1.0 + u))
            assert int((w >= 5.0).sum()) >= 2, (mode, from_start)


@pytest.mark.parametrize("how", ["DEVRNG_CPU_KERNEL=0", "extension absent"])
def test_without_the_kernel_the_same_numbers_come_from_tensor_ops(how: str) -> None:
    if how == "DEVRNG_CPU_KERNEL=0":
        lines = _probe({"DEVRNG_CPU_KERNEL": "0"})
        assert "switched off by DEVRNG_CPU_KERNEL=0" in lines[1]
    else:  # as after an install without a compiler: the module cannot be imported
        lines = _probe(prelude=f"import sys; sys.modules[{KERNEL_MODULE!r}] = None\n")
        assert "not available (devrng was installed without it)" in lines[1]
        assert "C compiler" in lines[1]
    assert lines[0] == "False"
    assert "tensor ops" in lines[1]
    assert lines[2] == _want()


def _copy_tree(dest: Path) -> Path:
    """What ``pip install .`` reads, copied so the build writes nothing into the checkout."""
    dest.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "*.egg-info"))
    return dest


def _wheel(tmp_path: Path, name: str, env: dict[str, str]) -> Path:
    tree = _copy_tree(tmp_path / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-w", str(tree / "dist"), str(tree)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tree / "dist").glob("devrng-*.whl")
    return wheel


@pytest.mark.slow
def test_pip_builds_the_kernel_into_the_wheel_and_installs_without_a_compiler(
        tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("CC", "PYTHONPATH")}
    with_cc = _wheel(tmp_path, "with", env)
    names = zipfile.ZipFile(with_cc).namelist()
    assert f"devrng/_portable/_threefry_kernel{ABI3}" in names
    assert f"devrng/_portable/_threefry_kernel{ABI3}.sha256" in names
    assert "-cp311-abi3-" in with_cc.name  # one wheel for every supported CPython
    assert not any(n.endswith(".c") for n in names)  # the build, not the source

    without_cc = _wheel(tmp_path, "without", {**env, "CC": "/nonexistent/cc"})
    assert not any("_threefry_kernel" in n for n in zipfile.ZipFile(without_cc).namelist())
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site),
                    str(without_cc)], check=True, capture_output=True, env=env, timeout=600)
    # Only the installed copy on the path, not this checkout's src.
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(site)}, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    used, why, drawn = out.stdout.strip().splitlines()
    assert used == "False" and "installed without it" in why and "C compiler" in why
    assert drawn == _want()
    doctor = subprocess.run([sys.executable, "-m", "devrng", "doctor"], capture_output=True,
                            text=True, env={**env, "PYTHONPATH": str(site)}, cwd=tmp_path,
                            timeout=600)
    assert "fused C kernel NOT in use" in doctor.stdout


@pytest.mark.slow
def test_a_compiler_that_cannot_be_kept_from_fusing_multiply_adds_builds_no_kernel(
        tmp_path: Path) -> None:
    """A C compiler that refuses -ffp-contract=off (faked: cc, refusing that flag, as a
    compiler neither GCC nor clang might) could round the float draws differently from torch:
    the build says so and leaves the kernel out; the install goes on."""
    import os

    fake = tmp_path / "cc-without-fp-contract"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do\n  if [ "$a" = -ffp-contract=off ]; then\n'
                    '    echo "cc: error: unrecognized option $a" >&2; exit 1\n  fi\ndone\n'
                    'exec cc "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "PYTHONPATH")}
    tree = _copy_tree(tmp_path / "tree")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-v", "-w", str(tree / "dist"), str(tree)], capture_output=True,
                         text=True, env={**env, "CC": str(fake)}, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "devrng's kernel is not built: the C compiler refuses" in said
    assert "-ffp-contract=off" in said and "tensor ops instead" in said
    (wheel,) = (tree / "dist").glob("devrng-*.whl")
    assert not any("_threefry_kernel" in n for n in zipfile.ZipFile(wheel).namelist())


def test_libraries_planted_in_the_old_kernel_cache_are_never_loaded(tmp_path: Path) -> None:
    """devrng up to 0.3 compiled the kernel into ~/.cache/devrng/kernels (or
    DEVRNG_CACHE_DIR) and loaded whatever it found there: plant a library whose constructor
    leaves a mark at every such place, then draw."""
    mark = tmp_path / "planted-code-ran"
    planted_c = tmp_path / "planted.c"
    planted_c.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void run(void) {{ FILE *f = fopen("{mark}", "w");'
        " if (f) fclose(f); }\n"
        "void devrng_threefry(void) {}\n")
    home = tmp_path / "home"
    places = [home / ".cache" / "devrng" / "kernels", tmp_path / "xdg" / "devrng" / "kernels",
              tmp_path / "explicit"]
    for place in places:
        place.mkdir(parents=True)
        for name in ("threefry-0000000000000000.so", "threefry.so", f"_threefry_kernel{SUFFIX}"):
            subprocess.run(["cc", "-shared", "-fPIC", "-o", str(place / name), str(planted_c)],
                           check=True)
    before = sorted(p for p in tmp_path.rglob("*"))
    lines = _probe({"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                    "DEVRNG_CACHE_DIR": str(tmp_path / "explicit")})
    assert lines[0] == "True" and lines[2] == _want()
    assert not mark.exists(), "a planted library ran inside the process"
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written at run time


def _damaged_kernel(tmp_path: Path, change: str) -> Path:
    """A package folder holding ``_threefry_kernel`` built from damaged source or damaged
    after its build recorded its digest."""
    source = SOURCE.read_text()
    if change == "wrong rotation":
        source = source.replace("ROUND(13) ROUND(15)", "ROUND(12) ROUND(15)", 1)
    elif change == "no entry point":
        source = source.replace('{"randint", ', '{"rand1nt", ')
    folder = tmp_path / change.replace(" ", "-")
    folder.mkdir()
    built = folder / f"_threefry_kernel{SUFFIX}"
    include = sysconfig.get_paths()["include"]
    (folder / "k.c").write_text(source)
    # Fused multiply-adds round the float transforms' steps once where torch rounds twice.
    flags = ["-O2", "-mfma", "-ffp-contract=fast"] if change == "fused multiply-adds" else ["-O1"]
    subprocess.run(["cc", "-shared", "-fPIC", *flags, f"-I{include}", "-o", str(built),
                    str(folder / "k.c")], check=True, capture_output=True)
    # The digest a build records; the file is damaged after it was recorded.
    digest = Path(f"{built}.sha256")
    digest.write_text(hashlib.sha256(built.read_bytes()).hexdigest() + "\n")
    data = bytearray(built.read_bytes())
    if change == "truncated":  # loading it would crash the process (SIGBUS)
        built.write_bytes(data[:4096])
    elif change == "one bit flipped":
        data[len(data) // 2] ^= 0x10
        built.write_bytes(data)
    elif change == "no digest":
        digest.unlink()
    return folder


def _has_fma() -> bool:
    try:
        return " fma " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize(("change", "said"), [
    ("wrong rotation", "gave wrong answers for the known test vectors"),
    pytest.param("fused multiply-adds", "gave wrong answers for the known test vectors",
                 marks=pytest.mark.skipif(not _has_fma(), reason="this CPU has no FMA")),
    ("no entry point", "has no fill(), randint(), block() or sort()"),
    ("truncated", "does not match the SHA-256 recorded when it was built"),
    ("one bit flipped", "does not match the SHA-256 recorded when it was built"),
    ("no digest", "cannot be checked"),
])
def test_a_damaged_kernel_is_refused_with_a_sentence_and_the_numbers_stay_right(
        tmp_path: Path, change: str, said: str) -> None:
    folder = _damaged_kernel(tmp_path, change)
    # The damaged build is found first, as if it had replaced the installed one.
    out = run_python("from tests._internals import portable_package as p\n"
                     f"p.__path__.insert(0, {str(folder)!r})\n" + PROBE)
    assert out.returncode == 0, out.stderr
    used, why, drawn = out.stdout.strip().splitlines()
    assert used == "False"
    assert said in why and "tensor ops" in why
    assert drawn == _want()
    # Seen without any logging set up: one DevRNGWarning (Python's default filters print it)
    # for a draw and two status() calls, with doctor's sentence.
    assert out.stderr.count("DevRNGWarning") == 1, out.stderr
    assert f"DevRNGWarning: devrng.portable: {ast.literal_eval(why)}" in out.stderr


def test_a_refused_kernel_warns_once_per_process_even_when_warnings_repeat(
        tmp_path: Path) -> None:
    folder = _damaged_kernel(tmp_path, "wrong rotation")
    out = run_python(f"""
import warnings, torch, devrng
from tests._internals import portable_package as p
p.__path__.insert(0, {str(folder)!r})
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for seed in range(3):
        with devrng.portable(seed):
            torch.rand(3), torch.randn(3)
print([type(w.message).__name__ for w in seen])
""")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['DevRNGWarning']"


@pytest.mark.parametrize("value", ["0", "false", "OFF", " No ", "1", "true", "On", "YES", ""])
def test_devrng_cpu_kernel_takes_the_usual_spellings_of_off_and_on(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVRNG_CPU_KERNEL", value)
    assert switched_off() is (value.strip().lower() in ("0", "false", "off", "no"))


@pytest.mark.parametrize("value", ["00", "maybe", "disable", "2"])
def test_devrng_cpu_kernel_refuses_a_value_that_is_neither_off_nor_on(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVRNG_CPU_KERNEL", value)
    with pytest.raises(DevRNGError, match=rf"DEVRNG_CPU_KERNEL='{value}' is neither on nor off: "
                                          r"set it to 0, false, off or no .* or to 1, true, on"):
        switched_off()


def test_devrng_cpu_kernel_spellings_reach_the_first_draw_and_doctor() -> None:
    lines = _probe({"DEVRNG_CPU_KERNEL": "Off"})  # off: the tensor ops, the same numbers
    assert lines[0] == "False" and "switched off by DEVRNG_CPU_KERNEL=Off" in lines[1]
    assert lines[2] == _want()
    assert _probe({"DEVRNG_CPU_KERNEL": "yes"})[0] == "True"
    bad = run_python(PROBE, env={"DEVRNG_CPU_KERNEL": "offf"})
    assert bad.returncode != 0
    assert "DevRNGError: DEVRNG_CPU_KERNEL='offf' is neither on nor off" in bad.stderr
    doctor = run_python("devrng", args=["doctor"], module=True, env={"DEVRNG_CPU_KERNEL": "offf"})
    assert "fused C kernel NOT in use: DEVRNG_CPU_KERNEL='offf' is neither" in doctor.stdout
    assert "ERROR: DEVRNG_CPU_KERNEL='offf'" in doctor.stdout and doctor.returncode == 1


def test_doctor_says_whether_the_kernel_is_in_use() -> None:
    on = run_python("devrng", args=["doctor"], module=True)
    off = run_python("devrng", args=["doctor"], module=True, env={"DEVRNG_CPU_KERNEL": "0"})
    assert "fused C kernel in use: compiled at install time" in on.stdout
    assert "fused C kernel NOT in use: switched off by DEVRNG_CPU_KERNEL=0" in off.stdout
    assert "more slowly" in off.stdout


def _flip_verdicts(tmp_path: Path, count: int, seed: int) -> Counter[str]:
    """``count`` single-bit flips in the code this CPU runs of the installed kernel, each
    judged by devrng's loader with the digest rewritten to match (tests/_kernel_flips.py)."""
    import importlib.util

    spec = importlib.util.find_spec(KERNEL_MODULE)
    assert spec is not None and spec.origin is not None
    library = Path(spec.origin)
    data = library.read_bytes()
    if sys.platform != "linux" or data[:6] != b"\x7fELF\x02\x01" or not hasattr(os, "fork"):
        pytest.skip("the flips read a 64-bit little-endian ELF library and fork (Linux)")
    flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
    flips = sample_flips(running_code(data, flags), count, seed)
    out = run_python("tests._kernel_flips", module=True, timeout=600,
                     args=[str(library), str(tmp_path), *(f"{o}:{b}" for _, o, b in flips)])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(flips), out.stdout + out.stderr
    where = {f"{o}:{b}": name for name, o, b in flips}
    verdicts = Counter(line.split()[1] for line in lines)
    print(f"{count} flips: {dict(verdicts)}")
    # Refused at load, or the same numbers on every path; a crash or a hang is loud. A flip
    # that wrote over memory outside the kernel (the intact kernel's draws changed too) is
    # beyond any known-answer check. Never a silently wrong number.
    wrong = [f"{where[line.split()[0]]} {line}" for line in lines
             if line.split()[1] not in ("refused", "exact", "crashed", "hung", "corrupted")]
    assert not wrong, wrong
    return verdicts


def test_a_few_bit_flips_in_the_kernels_code_are_refused_or_give_the_same_numbers(
        tmp_path: Path) -> None:
    _flip_verdicts(tmp_path, 8, seed=0)


@pytest.mark.slow
def test_hundreds_of_bit_flips_in_the_kernels_code_are_refused_or_give_the_same_numbers(
        tmp_path: Path) -> None:
    verdicts = _flip_verdicts(tmp_path, 400, seed=1)
    assert verdicts["refused"] > 100  # the flips reach the known-answer check


def test_the_kernels_block_gives_the_keys_of_draws_as_python_does() -> None:
    # Once loaded, the kernel derives the keys (fold_in) of every draw: the same words as
    # the 20 rounds in Python, for keys and counters of every size.
    cpu = kernel()
    assert cpu is not None
    rng = np.random.default_rng(3)
    for _ in range(200):
        key = (int(rng.integers(0, 2**32)), int(rng.integers(0, 2**32)))
        n = int(rng.integers(0, 2**63)) >> int(rng.integers(0, 63))
        want = threefry.threefry_host(key, (n >> 32, n & 0xFFFFFFFF))
        assert cpu.block(*key, n >> 32, n & 0xFFFFFFFF) == want
        assert threefry.fold_in(key, n) == want
    with pytest.raises(ValueError, match="beyond 32 bits"):
        cpu.block(1 << 32, 0, 0, 0)


@pytest.mark.parametrize("threads", [2, 3])
def test_long_draws_are_shared_among_threads_and_give_the_same_bits(
        monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    # A draw of PARALLEL_FROM elements or more is cut into parts of whole blocks, one per
    # intra-op thread of torch: every mode and randint give the bits of one call.
    cpu = kernel()
    assert cpu is not None
    n, start = 3 * PARALLEL_FROM + 37, (1 << 64) - PARALLEL_FROM  # wraps past 2**64
    counters = torch.arange(n, dtype=torch.int64) * 7919 - 5
    spans: list[int] = []
    fill, randint = cpu._fill, cpu._randint  # what one call of the extension gives

    def draws() -> list[torch.Tensor]:
        got = []
        for mode, dtype in DTYPES.items():
            out = [torch.empty(n, dtype=dtype) for _ in range(2 if mode == WORDS else 1)]
            cpu.run((5, 6), mode, *out, start=start, scale=0.375, shift=-0.25)
            got += out
            out = [torch.empty(n, dtype=dtype) for _ in range(2 if mode == WORDS else 1)]
            cpu.run((5, 6), mode, *out, counters=counters, scale=0.375, shift=-0.25)
            got += out
        wide = torch.empty(n, dtype=torch.int64)
        cpu.randint(((1, 2), (3, 4)), 1000, jax_multiplier(1000), -3, wide, start=start)
        return [*got, wide]

    torch.set_num_threads(1)
    try:
        one = draws()
        monkeypatch.setattr(cpu, "_fill", lambda *a: (spans.append(a[4]), fill(*a)))
        monkeypatch.setattr(cpu, "_randint", lambda *a: (spans.append(a[6]), randint(*a)))
        torch.set_num_threads(threads)
        parts = draws()
    finally:
        torch.set_num_threads(1)
    for a, b in zip(one, parts, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    calls = len(DTYPES) * 2 + 1
    assert len(spans) >= calls * threads and sum(spans) == calls * n  # in parts
    assert sum(s % 256 != 0 for s in spans) <= calls  # whole blocks but each draw's last part


@pytest.mark.parametrize("values", ["indices", "negative", "wide"])
@pytest.mark.parametrize("spread", ["half equal", "one top byte", "random"])
def test_the_kernels_sort_is_stable_in_the_unsigned_order_of_the_keys(values: str, spread: str
                                                                      ) -> None:
    # randperm's rounds sort by random 32-bit keys: equal keys keep their order, keys with the
    # top bit set come after the others (unsigned), and short and empty arrays work. Values in
    # [0, 2**32) (a permutation's) travel packed with their keys; others (negative, or 2**32
    # and above) apart. From 2**20 numbers packed ones are first split by the top byte: keys
    # that all share it (one run of all of them) are sorted the other way.
    cpu = kernel()
    assert cpu is not None
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 255, 256, 257, 2048, 5000, 70000, 2**20 + 3):
        keys = rng.integers(-2**31, 2**31, size=n, dtype=np.int64)
        if spread == "half equal":
            keys[: n // 2] &= 0x8000000F  # many equal keys, with and without the top bit
        elif spread == "one top byte":
            keys = (keys & 0x00FFFF00) | (0x7F << 24)
        keys32 = torch.from_numpy(keys.astype(np.int32))
        moved = {"indices": torch.randperm(n), "negative": torch.arange(n) * 3 - 7,
                 "wide": torch.arange(n) + 2**32 * (torch.arange(n) % 3)}[values]
        order = torch.sort(keys32.to(torch.int64) & 0xFFFFFFFF, stable=True).indices
        want_keys, want = keys32[order], moved[order]
        cpu.sort(keys32, moved)
        assert torch.equal(moved, want) and torch.equal(keys32, want_keys), n


def test_the_kernels_proof_refuses_a_sort_that_is_unstable_or_does_not_count() -> None:
    # The import-time proof runs the sort on equal keys, on its passes of 8 and of 11 bits, and
    # with the values counted from 0 by the kernel (randperm's first round).
    cpu = kernel()
    assert cpu is not None
    real = cpu._sort
    assert sorts_stably(real)

    def unstable(keys: int, values: int, n: int, *rest: object) -> None:
        real(keys, values, n, *rest)
        k, v = (ctypes.c_uint32 * n).from_address(keys), (ctypes.c_int64 * n).from_address(values)
        i = next(i for i in range(n - 1) if k[i] == k[i + 1])  # two equal keys' values swapped
        v[i], v[i + 1] = v[i + 1], v[i]

    def not_counting(keys: int, values: int, n: int, keys_tmp: int, values_tmp: int,
                     counted: bool = False) -> None:
        real(keys, values, n, keys_tmp, values_tmp)

    assert not sorts_stably(unstable)
    assert not sorts_stably(not_counting)
    assert not sorts_stably(lambda *args: None)
