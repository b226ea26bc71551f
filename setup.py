"""devrng's one build step: the optional C extension behind devrng.portable's CPU draws.

Everything else about the package is in pyproject.toml. The extension is optional:
without a C compiler the install goes on (setuptools warns) and devrng draws with
tensor ops instead; ``devrng doctor`` says which is in use. Beside the built
library goes its SHA-256 (``<library>.sha256``), which devrng checks before it
imports the library: a truncated or altered file is refused, not loaded.
"""

import hashlib
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _write_digest(path: str) -> None:
    with open(path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    with open(path + ".sha256", "w") as fh:
        fh.write(digest + "\n")


class DigestBuildExt(build_ext):
    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)
        _write_digest(self.get_ext_fullpath(ext.name))

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


# No fused multiply-adds (clang contracts by default): the kernel's float transforms must
# round each operation as torch's eager CPU kernels do. Neither errno nor floating-point
# exception flags are read, which lets the transforms' loops vectorise; values are the same.
flags = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing", "-ffp-contract=off",
                                             "-fno-math-errno", "-fno-trapping-math"]
setup(ext_modules=[Extension("devrng._portable._threefry_kernel", ["src/devrng/_portable/_threefry_kernel.c"],
                             extra_compile_args=flags, optional=True)],
      cmdclass={"build_ext": DigestBuildExt})
