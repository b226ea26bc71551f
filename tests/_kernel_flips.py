"""Single-bit flips in the C kernel's machine code, each judged by devrng's own loader.

``python -m tests._kernel_flips LIBRARY FOLDER OFFSET:BIT ...`` prints one line per flip:
the flip, then ``refused`` (the loader did not use the kernel), ``exact`` (it used it, and
every draw of ``battery`` equals the intact kernel's), ``wrong`` (it used it and some draw
differs: a silently wrong number), ``corrupted`` (the intact kernel's draws changed too: the
flip wrote over other memory), or ``crashed <signal>`` / ``hung`` (the process loading or
running it died). Each flipped library gets a digest file that matches it, as someone who
can write the package could make: only the kernel's known-answer check stands in the way.

Each flip is tried in a child forked from this process, so that a crash or a hang costs one
child; this process imports torch once, with one thread (safe to fork). The intact kernel
never runs in this process (a child draws its battery): a flipped kernel must not find the
intact one's values on the stack it inherits. (A flip that turns a store to a stack slot
into a load, 0x7f -> 0x6f in a vmovdqa64, read back the intact kernel's value for the very
inputs of the known-answer check, and passed it, as it never could in a process where the
kernel had not run before its check.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import random
import signal
import struct
import sys
import time
from pathlib import Path

import torch
from tests._internals import KERNEL_MODULE, CpuKernel, jax_multiplier, load_checked

HANG_SECONDS = 10  # a flip takes about 0.1 s
N = 4099  # the longest draw: 16 blocks of 256 and a partial one


def _spec(path: Path) -> importlib.machinery.ModuleSpec:
    spec = importlib.util.spec_from_file_location(KERNEL_MODULE, path)
    assert spec is not None
    return spec


def battery(cpu: CpuKernel) -> list[bytes]:
    """Every entry point, mode and output dtype of the kernel, from starts and from counters,
    at lengths across the block size (256), under keys unlike the proof's."""
    out: list[bytes] = []
    gen = torch.Generator().manual_seed(7)
    keys = [(0x9E3779B9, 0x7F4A7C15), (0, 0xFFFFFFFF)]
    counters = torch.randint(-(1 << 63), (1 << 63) - 1, (N,), generator=gen)
    for n in (0, 1, 7, 255, 256, 257, 700, N):
        for start in (0, (1 << 32) - 100, (1 << 64) - 50):
            for form in ({"start": start}, {"counters": counters[:n].contiguous()}):
                key = keys[n % 2]
                for mode, scale, shift in ((0, 1.0, 0.0), (1, 1.0, 0.0), (2, 1.0, 0.0),
                                           (3, 1.0, 0.0), (4, 1.0, 0.0), (5, 1.0, 0.0),
                                           (6, 0.2, -0.1), (6, 3.0, 2.0), (7, 0.02, 0.5),
                                           (7, 3.0, -1.0)):
                    dtype = {1: torch.int32, 0: torch.int32, 3: torch.float64}.get(
                        mode, torch.float32)
                    outs = [torch.empty(n, dtype=dtype) for _ in range(1 + (mode == 1))]
                    cpu.run(key, mode, *outs, scale=scale, shift=shift,
                            **form)  # type: ignore[arg-type]
                    out += [o.numpy().tobytes() for o in outs]
                for span in (1, 2, 3, 10, 1000, 65535, 65536, 65537, 1 << 20, (1 << 31) + 5,
                             (1 << 32) - 1):
                    for dtype, low in ((torch.int64, -7), (torch.int32, -(1 << 31))):
                        got = torch.empty(n, dtype=dtype)
                        cpu.randint((key, keys[1 - n % 2]), span, jax_multiplier(span), low, got,
                                    **form)  # type: ignore[arg-type]
                        out.append(got.numpy().tobytes())
    return out


_CLONES = (".avx512f", ".avx2", ".default")  # setup.py's target_clones, best first


def _functions(library: bytes) -> dict[str, tuple[int, int]]:
    """The functions of an ELF64 (little-endian) library: name -> (file offset, size), read
    from its symbol table."""
    shoff, = struct.unpack_from("<Q", library, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", library, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", library, shoff + i * shentsize)
                for i in range(shnum)]
    found = {}
    for _, kind, _, _, offset, size, link, _, _, _ in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        names = sections[link][4]
        for at in range(offset, offset + size, 24):
            name_at, info, _, index, value, length = struct.unpack_from("<IBBHQQ", library, at)
            if info & 0xF == 2 and length:  # STT_FUNC
                start = names + name_at
                name = library[start:library.index(b"\0", start)].decode()
                section = sections[index]
                found[name] = (value - section[3] + section[4], length)
    return found


def running_code(library: bytes, cpu_flags: set[str]) -> dict[str, tuple[int, int]]:
    """The functions this CPU runs: all but the clones (target_clones) made for other CPUs."""
    functions = _functions(library)
    clones = [c for c in _CLONES if any(name.endswith(c) for name in functions)]
    runs = next((c for c in clones if c == ".default" or c[1:] in cpu_flags), None)
    return {name: where for name, where in functions.items()
            if not any(c in name for c in clones if c != runs)}


def sample_flips(functions: dict[str, tuple[int, int]], count: int, seed: int
                 ) -> list[tuple[str, int, int]]:
    """``count`` distinct (function, file offset, bit), uniform over the functions' bytes."""
    rng = random.Random(seed)
    spans = sorted(functions.items())
    total = sum(size for _, (_, size) in spans)
    flips: dict[tuple[int, int], str] = {}
    while len(flips) < min(count, 8 * total):
        k = rng.randrange(total)
        for name, (offset, size) in spans:
            if k < size:
                flips[(offset + k, rng.randrange(8))] = name
                break
            k -= size
    return [(name, offset, bit) for (offset, bit), name in flips.items()]


def _intact(library: Path) -> CpuKernel:
    cpu, why, _ = load_checked(_spec(library))
    assert cpu is not None, why
    return cpu


def _judge(data: bytes, folder: Path, want: list[bytes]) -> int:
    """In the child: 1 refused, 0 exact, 2 wrong, 4 corrupted (the intact kernel's draws
    changed too: the flip wrote over memory outside the kernel, its inputs, say)."""
    signal.alarm(HANG_SECONDS)
    library = folder / Path(sys.argv[1]).name
    library.write_bytes(data)
    Path(f"{library}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    cpu, _, _ = load_checked(_spec(library))
    if cpu is None:
        return 1
    if battery(cpu) == want:
        return 0
    return 2 if battery(_intact(Path(sys.argv[1]))) == want else 4


def _intact_battery(library: Path) -> list[bytes]:
    """The intact kernel's battery, drawn in a child (see the module docstring)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with os.fdopen(write, "wb") as fh:
                pickle.dump(battery(_intact(library)), fh)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        want: list[bytes] = pickle.load(fh)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return want


def main() -> None:
    torch.set_num_threads(1)
    library, folder = Path(sys.argv[1]), Path(sys.argv[2])
    intact = library.read_bytes()
    want = _intact_battery(library)
    for i, flip in enumerate(sys.argv[3:]):
        offset, bit = (int(x) for x in flip.split(":"))
        data = bytearray(intact)
        data[offset] ^= 1 << bit
        child_folder = folder / str(i)
        child_folder.mkdir()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            code = 3
            try:
                code = _judge(bytes(data), child_folder, want)
            finally:
                os._exit(code)
        started = time.monotonic()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            verdict = "hung" if sig == signal.SIGALRM else f"crashed {signal.Signals(sig).name}"
        else:
            verdict = {0: "exact", 1: "refused", 2: "wrong", 4: "corrupted"}.get(os.WEXITSTATUS(status),
                                                                f"error {status}")
        print(f"{flip} {verdict} {time.monotonic() - started:.2f}", flush=True)


if __name__ == "__main__":
    main()
