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
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "devrng"
# The deliberate lazy kinds: the package face, registry targets, the command line (so that
# `devrng --help` never waits for torch).
LAZY_IMPORTS_ALLOWED = {"devrng", "devrng._backends.registry", "devrng.__main__"}


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
    bad = ("from devrng._backends.registry import _resolved, get_backend\n"
           "from devrng._backends import registry\n"
           "import devrng\n"
           "x = registry._entries\n"
           "y = devrng._LAZY\n"
           "def f():\n"
           "    from devrng._generators.plan import make_plan\n")
    assert [v.split(": ")[1] for v in private_names_used(bad)] == [
        "from devrng._backends.registry import _resolved", "registry._entries", "devrng._LAZY"]
    assert nested_sibling_imports(bad) == ["line 7: devrng._generators.plan"]
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


# The one test file that may name devrng's private modules (each once, saying why), and this
# one, which reads devrng's source by path and plants violations below.
INTERNALS = Path("tests/_internals.py")
PRIVATE_MODULES_ALLOWED = {INTERNALS, Path("tests/test_layering.py")}


def _private_module(dotted: str) -> bool:
    """``devrng._cli``, ``devrng._portable.threefry``, ``devrng.__main__._parser``: a part after
    ``devrng`` that starts with an underscore and is no dunder (``__main__``, ``__all__``)."""
    parts = dotted.split(".")
    return parts[0] == "devrng" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:])


def private_modules_named(source: str) -> list[str]:
    """The private devrng modules (and private names of ``devrng.__main__``) that ``source``
    imports or names in a string (``importlib.import_module``, ``sys.modules[...]``, code a
    child runs); docstrings may mention them."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    bad: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            named = re.findall(r"\bdevrng(?:\.\w+)+", node.value)
        else:
            continue
        bad += [(node.lineno, name) for name in named if _private_module(name)]
    return [f"line {line}: {name}" for line, name in sorted(dict.fromkeys(bad))]


@pytest.mark.parametrize("path", sorted(set(TESTS) - PRIVATE_MODULES_ALLOWED, key=str), ids=str)
def test_tests_reach_private_modules_only_through_internals(path: Path) -> None:
    """White-box tests take what they need from tests/_internals.py, which says why; every
    other test goes through devrng's public API."""
    bad = private_modules_named(TESTS[path])
    assert not bad, (f"{path} names private devrng modules: {bad}; use the public API, or "
                     f"add the name to {INTERNALS} with why a test needs it")


PLANTED = '''"""Docstrings may mention devrng._portable.threefry."""
import importlib, sys
import devrng
from devrng.__main__ import main
from devrng import testing, __version__
x = devrng.__all__, "devrng.testing", r"devrng\\._[a-z]"
from devrng._portable import threefry
from devrng import _cli
import devrng._versions as v
from devrng.__main__ import _parser
b = importlib.import_module("devrng._backends.xpu").backend
sys.modules["devrng._portable._threefry_kernel"] = None
def f(mod):
    """Nor here: devrng._jit."""
    sys.modules.pop(f"devrng._jit.compilers.{mod}")
    return "import torch; from devrng._base import sigint"
'''


def test_the_private_module_check_sees_violations(tmp_path: Path) -> None:
    assert [v.split(": ")[1] for v in private_modules_named(PLANTED)] == [
        "devrng._portable", "devrng._portable.threefry", "devrng._cli", "devrng._versions",
        "devrng.__main__._parser", "devrng._backends.xpu", "devrng._portable._threefry_kernel",
        "devrng._jit.compilers", "devrng._base"]
    # A real test file, copied, with one private import planted at its end.
    clean = TESTS[Path("tests/test_infer.py")]
    assert not private_modules_named(clean)
    copy = tmp_path / "test_infer.py"
    copy.write_text(clean + "from devrng._generators.infer import collect_devices\n")
    assert [v.split(": ")[1] for v in private_modules_named(copy.read_text())] == [
        "devrng._generators.infer", "devrng._generators.infer.collect_devices"]


def test_every_lock_is_fork_safe() -> None:
    """A plain threading lock held by another thread at os.fork() (DataLoader workers) stays
    held in the child forever; devrng's locks are devrng._base.locks.ForkSafeLock."""
    made_here = [name for name, source in MODULES.items() if name != "devrng._base.locks"
                 for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                     "threading.Lock", "threading.RLock", "Lock", "RLock")]
    assert not made_here, f"plain threading locks in {made_here}; use ForkSafeLock"


def sys_modules_reads(source: str) -> list[str]:
    """Every ``sys.modules.get(...)`` / ``sys.modules[...]`` read in ``source`` whose module
    is used for more than its presence or identity (``is``, ``is not``, ``in``)."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad = []
    for node in ast.walk(tree):
        read = (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.modules.get") or (
            isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules"
            and isinstance(node.ctx, ast.Load))
        parent = parents.get(id(node))
        if read and not (isinstance(parent, ast.Compare)
                         and all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops)):
            bad.append(f"line {node.lineno}: {ast.unparse(parents.get(id(node), node))}")
    return bad


def test_modules_another_thread_may_be_importing_are_read_through_imported() -> None:
    """A module is in sys.modules before its body has run: its attributes are read through
    devrng._base.lazy.imported, which waits for an import under way in another thread."""
    bad = {name: found for name, source in MODULES.items() if name != "devrng._base.lazy"
           and (found := sys_modules_reads(source))}
    assert not bad, f"read these through devrng._base.lazy.imported: {bad}"


def test_the_sys_modules_check_sees_violations() -> None:
    source = ('module = sys.modules.get("torch_xla")\n'
              'ok = sys.modules.get("torchax.device_module") is module\n'
              'present = "numpy" in sys.modules\n'
              'np = sys.modules["numpy"].random\n')
    assert sys_modules_reads(source) == ['line 1: module = sys.modules.get(\'torch_xla\')',
                                         "line 4: sys.modules['numpy'].random"]


# The capability packages, bottom up. A module imports (at import time) only modules on its
# own floor or below, and the capabilities on floor 3 do not import one another: each can be
# read, and changed, knowing only the floors beneath it. The state of a training run stands on
# its checks (the flight record it starts), which never reach up into it.
FLOORS = {"_base": 0, "_backends": 1, "_generators": 2, "_portable": 3, "_jit": 3, "_checks": 3,
          "_training": 4}
TOP = 5  # the package face, the public modules, the command line, the integrations


def floor_of(module: str) -> tuple[int, str]:
    """(floor, package) of a devrng module: ``devrng._generators.fork`` -> (2, '_generators')."""
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 else ""
    return FLOORS.get(package, TOP), package


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in sorted(graph.items()):
        floor, package = floor_of(module)
        for dep in sorted(deps):
            dep_floor, dep_package = floor_of(dep)
            if dep_floor > floor or (dep_floor == floor < TOP and dep_package != package):
                bad.append(f"{module} (floor {floor}) imports {dep} (floor {dep_floor})")
    return bad


def test_every_module_lives_in_a_capability_package() -> None:
    flat = [m for m in MODULES if m.count(".") == 1 and m.split(".")[1].startswith("_")
            and m.split(".")[1] not in FLOORS and m not in ("devrng.__main__", "devrng._cli",
                                                            "devrng._versions")]
    assert not flat, f"private modules outside the capability packages: {flat}"


def test_no_module_imports_a_higher_floor_or_a_sibling_capability() -> None:
    bad = upward_imports(import_graph(MODULES))
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_violations() -> None:
    graph = {"devrng._base.errors": {"devrng._generators.fork"},
             "devrng._jit.seeded": {"devrng._portable.rng"},
             "devrng._training.dcp": {"devrng._base.errors", "devrng._training.loaders"}}
    assert upward_imports(graph) == [
        "devrng._base.errors (floor 0) imports devrng._generators.fork (floor 2)",
        "devrng._jit.seeded (floor 3) imports devrng._portable.rng (floor 3)"]


_DOTTED = re.compile(r"^devrng(?:\.\w+)+(?::\w+)?$")


def string_module_paths() -> list[tuple[str, str]]:
    """(module, string) for every string constant in devrng's source that names one of its
    own modules, as the registry's lazy targets, the compiler table, ``_lazy.load`` calls and
    ``sys.modules.get`` do."""
    found = []
    for name, source in MODULES.items():
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and _DOTTED.match(node.value) and node.value.split(":")[0].split(".")[1]
                    .startswith("_") and not node.value.startswith("devrng.__")):
                found.append((name, node.value))
    return found


def names_nothing(path: str) -> str | None:
    """Why ``"devrng.x.y"`` / ``"devrng.x.y:attr"`` names no module or attribute, read from the
    source without importing it; None when it names one."""
    module, _, attr = path.partition(":")
    relative = Path(*module.split(".")[1:])
    file = SRC / relative.with_suffix(".py")
    package = SRC / relative / "__init__.py"
    source = file if file.exists() else package if package.exists() else None
    if source is None:
        # A C extension built at install time: its source sits beside the package.
        if not list((SRC / relative).parent.glob(f"{relative.name}.c")):
            return f"{path!r} names no module"
        return None
    defined = rf"^(def|class) {attr}\b|^(\w+, )*{attr}\b.*="  # `A, B = ...` defines B too
    if attr and not re.search(defined, source.read_text(), re.M):
        return f"{path!r}: {module} defines no {attr}"
    return None


def test_module_paths_written_as_strings_name_real_modules_and_attributes() -> None:
    paths = string_module_paths()
    assert len(paths) >= 20  # the registry, the package face, the compilers, lazy loads
    missing = [f"{where}: {why}" for where, path in paths if (why := names_nothing(path))]
    assert not missing, "\n".join(missing)


# Which code draws a portable number on which device is one table: the rest of the
# portable streams asks it (``devices.row(device)``) and never reads a device's type.
DEVICE_TABLE = "devrng._portable.devices"


def device_type_reads(source: str) -> list[str]:
    """Every ``.type`` read in ``source`` (``device.type == "xla"``, ``x.device.type in ...``,
    ``torch.device(d).type``, a second table keyed by it)."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr == "type"]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("devrng._portable")
                                        and m != DEVICE_TABLE))
def test_portable_draws_ask_the_device_table(name: str) -> None:
    bad = device_type_reads(MODULES[name])
    assert not bad, f"{name} tests device types itself; give {DEVICE_TABLE} a column: {bad}"


def test_the_device_table_check_sees_violations() -> None:
    bad = ('if key.device.type == "xla" and counters is None:\n'
           '    pass\n'
           'plain = x.device.type in ("mps", "jax") or torch.device(d).type != "cpu"\n'
           'fast = devices.row(x.device).host_memory and x.dtype == torch.float32\n')
    assert device_type_reads(bad) == [
        "line 1: key.device.type",
        "line 3: x.device.type", "line 3: torch.device(d).type"]
    assert device_type_reads(MODULES[DEVICE_TABLE])  # the table itself reads it, once


def test_every_private_name_in_internals_is_real_and_used() -> None:
    """tests/_internals.py lists what white-box tests need; an entry that no longer names
    anything, or that no test uses, is stale."""
    from tests import _internals

    entries = {name: f"{module}:{attr}" if attr else module
               for name, (module, attr) in _internals._PRIVATE.items()}
    entries |= {"KERNEL_MODULE": _internals.KERNEL_MODULE,
                "COMPILERS_PACKAGE": _internals.COMPILERS_PACKAGE,
                "KERNEL_LOADER": _internals.KERNEL_LOADER}
    fixes = {name: f"{module}:{attr}" for name, (module, attr) in _internals.FIXES.items()}
    assert [why for path in [*entries.values(), *fixes.values()]
            if (why := names_nothing(path))] == []
    others = "\n".join(source for path, source in TESTS.items() if path != INTERNALS)
    assert [name for name in [*entries, *fixes] if not re.search(rf"\b{name}\b", others)] == []


# This process's rank and the job's world size are one fact each, read in one module: a
# torchrun rank before init_process_group must record and check the same numbers.
RANK_MODULE = "devrng._base.rank"
_RANK_VARIABLES = ("RANK", "WORLD_SIZE")


def rank_reads(source: str) -> list[str]:
    """Every place ``source`` reads the rank or the world size itself: the default group's
    ``get_rank()`` / ``get_world_size()`` (no group given), or the ``RANK`` / ``WORLD_SIZE``
    environment variable."""
    found: list[ast.expr] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get_rank", "get_world_size") \
                and not node.args and not node.keywords:
            found.append(node)
        elif isinstance(node, (ast.Call, ast.Subscript)):
            where = node.func if isinstance(node, ast.Call) else node.value
            key = (node.args[:1] or [None])[0] if isinstance(node, ast.Call) else node.slice
            if isinstance(key, ast.Constant) and key.value in _RANK_VARIABLES \
                    and any(part in ast.unparse(where) for part in ("environ", "getenv")):
                found.append(node)
    found.sort(key=lambda node: (node.lineno, node.col_offset))
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in found]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != RANK_MODULE))
def test_the_rank_and_world_size_are_read_in_one_place(name: str) -> None:
    bad = rank_reads(MODULES[name])
    assert not bad, f"{name} reads the rank or world size itself; ask {RANK_MODULE}: {bad}"


def test_the_rank_check_sees_violations() -> None:
    bad = ('world = int(os.environ.get("WORLD_SIZE", 1))\n'
           'rank = os.environ["RANK"]\n'
           'n = dist.get_world_size() + torch.distributed.get_rank()\n'
           'size = dist.get_world_size(group)  # a given group: its own fact\n'
           'names = ("RANK", "WORLD_SIZE")\n'
           'seed = os.getenv("WORLD_SIZE")\n')
    assert rank_reads(bad) == [
        "line 1: os.environ.get('WORLD_SIZE', 1)", "line 2: os.environ['RANK']",
        "line 3: dist.get_world_size()", "line 3: torch.distributed.get_rank()",
        "line 6: os.getenv('WORLD_SIZE')"]
    assert rank_reads(MODULES[RANK_MODULE])  # the one place reads them


# A function that a Ctrl-C must not cut in half calls ``deliver()`` and is decorated with
# ``@guard`` where it stands (devrng._base.sigint), so that a reader sees it is guarded.
SIGINT_MODULE = "devrng._base.sigint"


def guard_problems(source: str) -> list[str]:
    """Functions that call ``deliver()`` without ``@guard``, and ``guard(...)`` called as a
    statement (a registration away from the function it guards)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = any(isinstance(n, ast.Call) and ast.unparse(n.func) == "deliver"
                        for n in ast.walk(node))
            if calls and not any(ast.unparse(d) == "guard" for d in node.decorator_list):
                bad.append(f"line {node.lineno}: {node.name} calls deliver() without @guard")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) == "guard":
            bad.append(f"line {node.lineno}: {ast.unparse(node)} (decorate the function)")
    return bad


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != SIGINT_MODULE))
def test_guarded_functions_are_decorated_where_they_stand(name: str) -> None:
    bad = guard_problems(MODULES[name])
    assert not bad, f"{name}: {bad}"


def test_the_guard_check_sees_violations() -> None:
    bad = ("def f():\n"
           "    try:\n"
           "        pass\n"
           "    finally:\n"
           "        deliver()\n"
           "@guard\n"
           "def g():\n"
           "    try:\n"
           "        pass\n"
           "    finally:\n"
           "        deliver()\n"
           "guard(g)\n")
    assert guard_problems(bad) == ["line 1: f calls deliver() without @guard",
                                   "line 12: guard(g) (decorate the function)"]


# The ranks talk to one another in few places: the per-rank protocol's collectives (a
# checkpoint's entries), devrng.distributed (what a user asks of a process group) and the
# trainer integrations' gather. A check of a single process's state never waits for a rank.
COLLECTIVE_MODULES = {"devrng._generators.ranks.collectives", "devrng.distributed",
                      "devrng.integrations._per_rank"}
_COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "all_to_all", "barrier",
                "broadcast", "broadcast_object_list", "gather", "gather_object", "irecv",
                "isend", "recv", "reduce", "reduce_scatter", "scatter", "scatter_object_list",
                "send"}


def collective_calls(source: str) -> list[str]:
    """Every call of a ``torch.distributed`` collective in ``source`` (``dist.all_reduce(...)``,
    ``torch.distributed.send(...)``, ``dist_or_none().all_gather_object(...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _COLLECTIVES:
            owner = ast.unparse(node.func.value)
            if owner in ("dist", "torch.distributed") or owner.startswith("dist_or_none("):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


@pytest.mark.parametrize("name", sorted(set(MODULES) - COLLECTIVE_MODULES))
def test_collectives_are_called_only_where_ranks_talk(name: str) -> None:
    bad = collective_calls(MODULES[name])
    assert not bad, f"{name} calls collectives; keep them in {sorted(COLLECTIVE_MODULES)}: {bad}"


def test_the_collective_check_sees_violations() -> None:
    bad = ("dist.all_reduce(t, op=dist.ReduceOp.MIN)\n"
           "torch.distributed.send(t, 1)\n"
           "dist_or_none().all_gather_object(out, obj)\n"
           "x.broadcast([4])  # an XLA builder's broadcast, not a collective\n"
           "t.scatter(1, index, 0.0)\n")
    assert collective_calls(bad) == ["line 1: dist.all_reduce", "line 2: torch.distributed.send",
                                     "line 3: dist_or_none().all_gather_object"]
    assert collective_calls(MODULES["devrng._generators.ranks.collectives"])


# Every seed devrng derives is one named function of devrng._base.seeds (a resume depends on
# each being the same forever): other modules call the derivation by its name, never the mixer.
SEEDS_MODULE = "devrng._base.seeds"
_MIXERS = {"mix64", "splitmix64", "nth_seed"}


def mixer_calls(source: str) -> list[str]:
    """Every call of SplitMix64's functions in ``source``."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in _MIXERS]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != SEEDS_MODULE))
def test_seeds_are_derived_by_name_in_one_module(name: str) -> None:
    bad = mixer_calls(MODULES[name])
    assert not bad, f"{name} derives a seed itself; name the derivation in {SEEDS_MODULE}: {bad}"


def test_the_derivation_check_sees_violations() -> None:
    bad = ("seed = nth_seed(base ^ KEPT, epoch)\n"
           "h = seeds.splitmix64(x)\n"
           "ok = loader_seed(seed, 0)\n")
    assert mixer_calls(bad) == ["line 1: nth_seed(base ^ KEPT, epoch)",
                                "line 2: seeds.splitmix64(x)"]
    assert mixer_calls(MODULES[SEEDS_MODULE])


# What a rank is (an int of 0 or more) is read in one function, in one wording
# (devrng._base.rank.count_problem): no other module words a rank's range itself.
_RANK_RANGE = re.compile(r"\brank\b[^.;]*\b(an int|0 or more|out of range|non-negative)", re.I)


def rank_range_sentences(source: str) -> list[str]:
    """String constants (f-string parts too, docstrings aside) in ``source`` that say what
    range a rank has."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and _RANK_RANGE.search(node.value)]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != RANK_MODULE))
def test_a_ranks_range_is_worded_in_one_place(name: str) -> None:
    bad = rank_range_sentences(MODULES[name])
    assert not bad, f"{name} words a rank's range itself; use {RANK_MODULE}.check_rank: {bad}"


def test_the_rank_range_check_sees_violations() -> None:
    bad = ('def f(rank):\n'
           '    """A rank is an int of 0 or more (a docstring may say so)."""\n'
           '    raise ValueError(f"rank={rank} is out of range; a rank is an int of 0 or more.")\n'
           'x = "the saved world size is 0"\n')
    assert rank_range_sentences(bad) == [
        "line 3: ' is out of range; a rank is an int of 0 or more.'"]
