"""The ``python`` blocks of the README and the docs pages, and the rule every one of them keeps.

A block either runs as copied on the CPU, or says it is a fragment:

- a **program** starts with its imports and leaves nothing out (no ``...``); the suite runs
  it (tests/test_examples.py), and a ``text`` block right after it is what it prints;
- a **console** block (``>>>``) imports what it uses and runs as a doctest;
- a **fragment** starts with ``# fragment:`` and names there every name it uses but does not
  define (``torch`` and ``devrng`` aside): ``# fragment: model, batch: yours``.

Signatures are not ``python`` blocks (``text``). ``rule_broken`` says how a block breaks the
rule, statically: tests/test_docs.py checks every block in the quick pass.
"""

from __future__ import annotations

import ast
import builtins
import doctest
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FRAGMENT = "# fragment:"

# A fenced block, also indented under a list item.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    flags=re.M | re.S)
# What every program may use without defining it.
_GIVEN = frozenset(dir(builtins)) | {"__file__", "__name__"}


class Block(NamedTuple):
    """A python block of a page, and the text block right after it (its output)."""

    where: str
    code: str
    output: str | None


def _dedent(match: re.Match[str]) -> str:
    indent = match["indent"]
    return "".join(line[len(indent):] if line.startswith(indent) else line
                   for line in match["body"].splitlines(keepends=True))


def python_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    fences = list(_FENCE.finditer(text))
    found: list[Block] = []
    for i, fence in enumerate(fences):
        if fence["lang"] != "python":
            continue
        after = fences[i + 1] if i + 1 < len(fences) else None
        shown = (after is not None and after["lang"] == "text"
                 and not text[fence.end():after.start()].strip())
        where = f"{page.relative_to(ROOT)}#{len(found)}"
        found.append(Block(where, _dedent(fence), _dedent(after) if shown and after else None))
    return found


def whole_program(code: str) -> bool:
    """Starts with its imports and leaves nothing out. (A ``...`` inside a comment,
    ``torch.load(..., weights_only=True)``, leaves nothing out.)"""
    body = "\n".join(line.split("#")[0] for line in code.splitlines())
    return code.lstrip().startswith(("import ", "from ")) and "..." not in body


def console(code: str) -> bool:
    return code.lstrip().startswith(">>>")


def fragment(code: str) -> bool:
    return code.lstrip().startswith(FRAGMENT)


def console_source(code: str) -> str:
    """The Python a ``>>>`` block runs, its prompts and outputs taken away."""
    examples = doctest.DocTestParser().get_examples(code)
    return "".join(example.source for example in examples)


def free_names(source: str) -> set[str]:
    """Names ``source`` reads but never binds (anywhere in it), builtins aside."""
    tree = ast.parse(source)
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return used - bound - _GIVEN


def _leading_comment(code: str) -> str:
    lines = code.lstrip().splitlines()
    return "\n".join(line for line in lines[:next((i for i, line in enumerate(lines)
                                                    if not line.startswith("#")), len(lines))])


def rule_broken(code: str) -> str | None:
    """How the block ``code`` breaks the rule (see the module docstring), or None."""
    try:
        source = console_source(code) if console(code) else code
        missing = free_names(source)
    except SyntaxError as err:
        return f"is not valid Python ({err.msg}, line {err.lineno}); a signature is a text block"
    if console(code) or whole_program(code):
        if missing:
            kind = "console block" if console(code) else "program"
            return (f"a {kind} that uses {sorted(missing)} without defining or importing them: "
                    f"as copied it fails (NameError); import or define them, or make it a "
                    f"fragment ({FRAGMENT} ...)")
        return None
    if not fragment(code):
        return (f"neither starts with its imports and runs as copied, nor starts with "
                f"'{FRAGMENT} <what it needs>' (it uses {sorted(missing)} undefined)")
    said = set(re.findall(r"\w+", _leading_comment(code)))
    unsaid = sorted(missing - said - {"torch", "devrng"})
    if unsaid:
        return f"a fragment whose first comment does not say where {unsaid} come from"
    return None
