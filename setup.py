"""devrng's one build step: the optional C extension behind devrng.portable's CPU draws.

Everything else about the package is in pyproject.toml. The extension is optional:
without a C compiler, or with one that cannot be kept from fusing multiply-adds, the
install goes on (setuptools warns, naming why) and devrng draws with tensor ops
instead; ``devrng doctor`` says which is in use. Beside the built library goes its
SHA-256 (``<library>.sha256``), which devrng checks before it imports the library: a
truncated or altered file is refused, not loaded.

The extension uses only the limited API of the lowest supported Python (3.11), so one
build (an abi3 wheel, ``cp311-abi3``) serves every later CPython on its platform.
"""

import hashlib
import os
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

# The lowest Python devrng supports (pyproject's requires-python; tests/test_packaging.py
# keeps them equal), as the limited API's version number and the abi3 wheel's tag.
LOWEST_PYTHON = (3, 11)
LIMITED_API = f"0x{LOWEST_PYTHON[0]:02X}{LOWEST_PYTHON[1]:02X}0000"
ABI3_TAG = f"cp{LOWEST_PYTHON[0]}{LOWEST_PYTHON[1]}"

# No fused multiply-adds (clang contracts by default): the kernel's float transforms must
# round each operation as torch's eager CPU kernels do. Neither errno nor floating-point
# exception flags are read, which lets the transforms' loops vectorise; values are the
# same. MSVC: /fp:precise, which since Visual Studio 2022 17.0 does not contract (the
# source also says #pragma fp_contract(off), and refuses older MSVC).
PINNED = {
    "unix": ["-O3", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-math-errno",
             "-fno-trapping-math"],
    "mingw32": ["-O3", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-math-errno",
                "-fno-trapping-math"],
    "msvc": ["/O2", "/fp:precise"],
}


def _write_digest(path: str) -> None:
    with open(path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    with open(path + ".sha256", "w") as fh:
        fh.write(digest + "\n")


class PinnedBuildExt(build_ext):
    """Builds the kernel only with a compiler held to IEEE rounding, and records its digest."""

    def build_extension(self, ext: Extension) -> None:
        flags = PINNED.get(self.compiler.compiler_type)
        if flags is None:
            raise CompileError(
                f"devrng's kernel is not built: the {self.compiler.compiler_type!r} compiler "
                "is not one devrng can keep from fusing multiply-adds (GCC, clang, MSVC); "
                "devrng.portable draws with tensor ops instead.")
        self._check_flags(flags)
        ext.extra_compile_args = [*flags, *ext.extra_compile_args]
        super().build_extension(ext)
        _write_digest(self.get_ext_fullpath(ext.name))

    def _check_flags(self, flags: list[str]) -> None:
        """Compile a probe with ``flags`` as errors: a compiler that ignores or refuses one
        (a cc that is neither GCC nor clang) stops the kernel's build with a sentence."""
        strict = ["/WX"] if self.compiler.compiler_type == "msvc" else ["-Werror"]
        with tempfile.TemporaryDirectory() as folder:
            probe = os.path.join(folder, "probe.c")
            with open(probe, "w") as fh:
                fh.write("int devrng_probe(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=folder,
                                      extra_postargs=[*flags, *strict])
            except CompileError as err:
                raise CompileError(
                    f"devrng's kernel is not built: the C compiler refuses {' '.join(flags)}, "
                    "with which devrng keeps it from fusing multiply-adds, so its float draws "
                    f"could differ from torch's; devrng.portable draws with tensor ops instead "
                    f"({err})") from err

    def copy_extensions_to_source(self) -> None:  # editable installs: the library in src/
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package = ".".join(ext.name.split(".")[:-1])
            filename = os.path.basename(self.get_ext_filename(ext.name))
            inplace = os.path.join(build_py.get_package_dir(package), filename)
            if os.path.exists(inplace):
                _write_digest(inplace)

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), *(p + ".sha256" for p in super().get_outputs())]


# The kernel calls nothing in the C library, so the linker (--as-needed) would record no
# libc at all, and auditwheel could not tell which manylinux the library fits: name it.
LINK = ["-Wl,--no-as-needed", "-lc"] if sys.platform.startswith("linux") else []

setup(ext_modules=[Extension("devrng._portable._threefry_kernel",
                             ["src/devrng/_portable/_threefry_kernel.c"],
                             define_macros=[("Py_LIMITED_API", LIMITED_API)],
                             extra_link_args=LINK, py_limited_api=True, optional=True)],
      cmdclass={"build_ext": PinnedBuildExt},
      options={"bdist_wheel": {"py_limited_api": ABI3_TAG}})
