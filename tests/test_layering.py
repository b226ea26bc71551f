"""The code's layering rules, read from the source with ``ast``.

- A leading underscore means "this module's own": no module imports another
  module's private name, or reaches one through an imported module.
- Sibling imports sit at the top of a module; only the deliberate lazy kinds
  import devrng modules inside functions (the package face in ``__init__``,
  registry targets in ``_registry``, the commands in ``__main__``; compilers are
  loaded through ``_lazy.load``).
- Top-level imports between devrng modules form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "devrng"
# The deliberate lazy kinds: the package face, registry targets, the command line (so that
# `devrng --help` never waits for torch).
LAZY_IMPORTS_ALLOWED = {"devrng", "devrng._registry", "devrng.__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p.read_text() for p in SRC.rglob("*.py")}


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import, with whether it runs at import time (module level or `if` blocks there)."""
    top: set[int] = set()
    for node in tree.body:
        top.add(id(node))
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` and the like
            top |= {id(n) for n in node.body}
    return [(n, id(n) in top) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _type_checking_only(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for n in node.body}
    return out


def _devrng_modules(node: ast.Import | ast.ImportFrom, known: dict[str, str] = MODULES
                    ) -> list[str]:
    """The devrng modules an import statement loads."""
    if isinstance(node, ast.ImportFrom):
        if not node.module or node.module.split(".")[0] != "devrng":
            return []
        subs = [f"{node.module}.{a.name}" for a in node.names]
        return [s for s in subs if s in known] or [node.module]
    return [a.name for a in node.names if a.name.split(".")[0] == "devrng"]


def private_names_used(source: str) -> list[str]:
    """Other modules' private names that ``source`` imports or reaches through a module."""
    tree = ast.parse(source)
    bad: list[str] = []
    module_aliases: set[str] = set()
    for node, _ in _imports(tree):
        if isinstance(node, ast.Import):
            module_aliases |= {a.asname or a.name for a in node.names
                               if a.name.split(".")[0] == "devrng" and "." not in (a.asname or a.name)}
            continue
        if not _devrng_modules(node):
            continue
        for alias in node.names:
            if f"{node.module}.{alias.name}" in MODULES:
                module_aliases.add(alias.asname or alias.name)
            elif alias.name.startswith("_") and not alias.name.endswith("__"):  # dunders are public
                bad.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return bad


def nested_sibling_imports(source: str) -> list[str]:
    """devrng imports that ``source`` makes inside functions."""
    return [f"line {node.lineno}: {', '.join(_devrng_modules(node))}"
            for node, top in _imports(ast.parse(source)) if not top and _devrng_modules(node)]


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the devrng modules it imports when it is imported."""
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        tree = ast.parse(source)
        typing_only = _type_checking_only(tree)
        deps = {dep for node, top in _imports(tree) if top and id(node) not in typing_only
                for dep in _devrng_modules(node, modules)}
        graph[name] = {d for d in deps if d in modules and d not in (name, "devrng")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path, node, dep]
            if dep not in state and (found := visit(dep, [*path, node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_crosses_a_module_boundary(name: str) -> None:
    bad = private_names_used(MODULES[name])
    assert not bad, f"{name} uses other modules' private names: {bad}"


@pytest.mark.parametrize("name", sorted(set(MODULES) - LAZY_IMPORTS_ALLOWED))
def test_sibling_imports_are_at_the_top(name: str) -> None:
    nested = nested_sibling_imports(MODULES[name])
    assert not nested, f"{name} imports devrng modules inside functions: {nested}"


def test_top_level_imports_form_no_cycle() -> None:
    cycle = find_cycle(import_graph(MODULES))
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_the_checks_see_violations() -> None:
    bad = ("from devrng._registry import _resolved, get_backend\n"
           "from devrng import _registry\n"
           "import devrng\n"
           "x = _registry._entries\n"
           "y = devrng._LAZY\n"
           "def f():\n"
           "    from devrng._plan import make_plan\n")
    assert [v.split(": ")[1] for v in private_names_used(bad)] == [
        "from devrng._registry import _resolved", "_registry._entries", "devrng._LAZY"]
    assert nested_sibling_imports(bad) == ["line 7: devrng._plan"]
    graph = import_graph({"devrng._a": "from devrng import _b\n",
                          "devrng._b": "import devrng._a\n", **MODULES})
    assert find_cycle(graph) == ["devrng._a", "devrng._b", "devrng._a"]


TESTS = {p.relative_to(SRC.parent.parent): p.read_text()
         for p in (SRC.parent.parent / "tests").rglob("*.py")}


@pytest.mark.parametrize("path", sorted(TESTS, key=str), ids=str)
def test_tests_reach_no_private_name_of_devrng(path: Path) -> None:
    """Tests go through public names (of devrng, or of its modules), so that the code stays
    free to change inside."""
    bad = private_names_used(TESTS[path])
    assert not bad, f"{path} uses devrng's private names: {bad}"


def test_every_lock_is_fork_safe() -> None:
    """A plain threading lock held by another thread at os.fork() (DataLoader workers) stays
    held in the child forever; devrng's locks are devrng._locks.ForkSafeLock."""
    made_here = [name for name, source in MODULES.items() if name != "devrng._locks"
                 for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                     "threading.Lock", "threading.RLock", "Lock", "RLock")]
    assert not made_here, f"plain threading locks in {made_here}; use ForkSafeLock"
