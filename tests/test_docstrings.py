"""Every docstring example runs: the CPU ones here, the XLA and torchax ones in the xla
environment (an example that imports torch_xla or torchax is skipped where they are
absent, and runs where they are). Outputs shown in docstrings are checked, not made up.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import devrng
from devrng._registry import registry, unregister_backend

HEAVY = ("torch_xla", "torchax")


def _modules() -> list[Any]:
    out = [devrng]
    for info in pkgutil.walk_packages(devrng.__path__, "devrng."):
        try:
            out.append(importlib.import_module(info.name))
        except ImportError:  # a backend or compiler whose package is absent here
            continue
    return out


def _examples() -> list[Any]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    for module in _modules():
        for test in finder.find(module, module.__name__):
            if test.examples and test.name not in found:
                found[test.name] = test
    return [pytest.param(test, id=name) for name, test in sorted(found.items())]


EXAMPLES = _examples()


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[None]:
    """Run in an empty folder; undo what examples change globally."""
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield
    finally:
        os.chdir(cwd)
        devrng.unpatch_torch()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # an example that failed half-way
        if "mydev" in registry:
            unregister_backend("mydev")


def test_there_are_examples_to_run() -> None:
    assert len(EXAMPLES) > 40


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example_runs(test: doctest.DocTest, clean: None) -> None:
    source = "\n".join(example.source for example in test.examples)
    missing = [m for m in HEAVY if f"import {m}" in source and importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (runs in the xla environment)")
    test.globs = {**test.globs, "torch": torch, "devrng": devrng}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
