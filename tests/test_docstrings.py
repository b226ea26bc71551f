"""Every docstring example runs: the CPU ones here, the XLA and torchax ones in the xla
environment. Where torch_xla or torchax is absent, a docstring's examples run up to the
first one that imports it (a CPU example comes first) and the rest are skipped; where they
are installed, all run. Outputs shown in docstrings are checked, not made up.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import os
import pkgutil
import pydoc
import re
from collections.abc import Iterator
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._internals import registry, unregister_backend

import devrng

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
    registered = set(registry)
    os.chdir(tmp_path)
    try:
        yield
    finally:
        os.chdir(cwd)
        devrng.unpatch_torch()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # an example that failed half-way
        for name in set(registry) - registered:  # backends an example registered
            unregister_backend(name)


def test_there_are_examples_to_run() -> None:
    assert len(EXAMPLES) > 40


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example_runs(test: doctest.DocTest, clean: None) -> None:
    missing = [m for m in HEAVY if importlib.util.find_spec(m) is None
               and any(f"import {m}" in example.source for example in test.examples)]
    first = next((i for i, example in enumerate(test.examples)
                  if any(f"import {m}" in example.source for m in missing)), None)
    if first == 0:
        pytest.skip(f"needs {', '.join(missing)} (runs in the xla environment)")
    if first is not None:  # the CPU examples before the first that needs a missing package
        test.examples = test.examples[:first]
    test.globs = {**test.globs, "torch": torch, "devrng": devrng}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)


# -- help() ----------------------------------------------------------------------------
def _public_objects() -> list[Any]:
    import devrng.distributed
    import devrng.testing

    found = [(f"devrng.{n}", getattr(devrng, n)) for n in devrng.__all__]
    found += [(f"devrng.testing.{n}", getattr(devrng.testing, n)) for n in devrng.testing.__all__]
    found += [(f"devrng.distributed.{n}", getattr(devrng.distributed, n))
              for n in devrng.distributed.__all__]
    return [pytest.param(obj, id=name) for name, obj in found]


# Lines pydoc writes itself, naming Python's own internals (a Protocol's __init__, a
# dataclass's parameters, the annotations of slots), not devrng's.
_PYDOC_OWN = re.compile(r"__(annotations|dataclass_params|init|subclasshook)__ = ")


@pytest.mark.parametrize("obj", _public_objects())
def test_help_text_has_no_link_syntax_and_no_private_names(obj: Any) -> None:
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    links = re.findall(r".{0,30}(?:\]\[|\]\(|:(?:func|class|meth|mod):`).{0,30}", text)
    assert not links, links
    body = [line for line in text.splitlines()[1:] if not _PYDOC_OWN.search(line)]  # 1: the title
    private = re.findall(r".{0,30}(?:(?<![\w.])_[A-Za-z]\w*|devrng\._\w+).{0,20}", "\n".join(body))
    assert not private, private


@pytest.mark.parametrize("obj", [p for p in _public_objects()
                                 if inspect.isclass(p.values[0]) and not is_dataclass(p.values[0])
                                 and "__init__" in p.values[0].__dict__
                                 and not getattr(p.values[0], "_is_protocol", False)])
def test_help_of_a_class_says_how_it_is_made(obj: type) -> None:
    """An __init__ devrng writes has a docstring: help() shows it, not pydoc's "Initialize
    self" (the __init__ of dataclasses, exceptions and protocols is Python's own)."""
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert "Initialize self" not in text
    assert obj.__init__.__doc__ and obj.__init__.__doc__.strip().endswith(".")


def test_the_help_check_sees_private_names_and_links() -> None:
    def leaky(_caller: str = "x") -> None:
        """See [`fork_rng`][devrng.fork_rng] in devrng._generators.fork."""

    with pytest.raises(AssertionError, match=r"\]\["):
        test_help_text_has_no_link_syntax_and_no_private_names(leaky)
    leaky.__doc__ = "Plain."
    with pytest.raises(AssertionError, match="_caller"):
        test_help_text_has_no_link_syntax_and_no_private_names(leaky)
