"""pyproject.toml claims only what CI tests: its bounds and extras against the pins in envs/*.txt.

CI builds one virtual environment per ``envs/<name>.txt`` (scripts/_venv.sh) and
tests on Python 3.11 only. These tests read both files, so a pin that moves
without the claim (or the other way round) fails here.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tests._internals import (
    KERNEL_PROOF,
    MIN_TORCH,
    TESTED_TORCH,
    VERSION_ATTR,
    bytecode,
    version_problems,
)

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*((?:[<>=!~]=?[^,;]+,?\s*)*)$")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def _parse(requirement: str) -> tuple[str, list[tuple[str, str]]]:
    """``"jax>=0.10, <1"`` -> ``("jax", [(">=", "0.10"), ("<", "1")])``."""
    match = _REQ.match(requirement.split(";")[0])
    assert match, f"cannot read the requirement {requirement!r}"
    specs = [re.match(r"([<>=!~]=?)\s*(.+)", s.strip()).groups()  # type: ignore[union-attr]
             for s in match.group(2).split(",") if s.strip()]
    return _name(match.group(1)), specs


def _admits(specs: list[tuple[str, str]], version: str) -> bool:
    have = _release(version)
    for op, want in specs:
        if want.endswith(".*"):
            prefix = _release(want[:-2])
            same = have[:len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        bound = _release(want)
        width = max(len(have), len(bound))
        a, b = have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b,
              "~=": a >= b and a[:len(bound) - 1] == b[:len(bound) - 1]}[op]
        if not ok:
            return False
    return True


def _env_pins() -> dict[str, dict[str, str]]:
    """``{"core": {"torch": "2.13.0", ...}, ...}`` from every envs/*.txt."""
    envs = {}
    for path in sorted((ROOT / "envs").glob("*.txt")):
        pins = {}
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                name, specs = _parse(line)
                assert [op for op, _ in specs] == ["=="], f"{path.name}: {line!r} is not a pin"
                pins[name] = specs[0][1]
        envs[path.stem] = pins
    return envs


ENVS = _env_pins()
TEST_ENVS = {name: pins for name, pins in ENVS.items() if "pytest" in pins}


def _lowest(specs: list[tuple[str, str]]) -> str:
    lows = [version for op, version in specs if op == ">="]
    assert len(lows) == 1, f"expected one '>=' bound, got {specs}"
    return lows[0]


PYTHON_SPECS = _parse("python" + PROJECT["requires-python"])[1]


def test_env_files_are_read() -> None:  # the tests below must not pass on nothing
    assert {"core", "xla", "ipex"} <= set(TEST_ENVS)
    assert all("torch" in pins for pins in TEST_ENVS.values())


@pytest.mark.parametrize("requirement", PROJECT["dependencies"])
def test_every_lower_bound_is_the_lowest_version_ci_tests(requirement: str) -> None:
    name, specs = _parse(requirement)
    lowest_claimed = _lowest(specs)
    tested = [pins[name] for pins in TEST_ENVS.values() if name in pins]
    assert tested, f"no test environment pins {name}"
    lowest_tested = min(tested, key=_release)
    assert _release(lowest_claimed) == _release(lowest_tested)[:len(_release(lowest_claimed))], (
        f"pyproject says {name}>={lowest_claimed}; the lowest {name} CI tests is {lowest_tested}")


def test_core_tests_the_torch_a_plain_install_gets() -> None:
    """`pip install .` takes the newest torch pip may install: core runs the whole suite,
    lint and docs on it. On these machines pip's own cap says which that is."""
    newest = max((pins["torch"] for pins in ENVS.values()), key=_release)
    assert ENVS["core"]["torch"] == newest
    cap = Path("/etc/xdg/pip/constraints.txt")
    capped = re.findall(r"^torch<=([\d.]+)", cap.read_text(), flags=re.M) if cap.exists() else []
    assert all(ENVS["core"]["torch"] == version for version in capped), (
        f"pip here installs torch {capped[0]} for `pip install .`; core tests {newest}")


def test_the_torch_releases_ci_tests_are_the_ones_doctor_names() -> None:
    """devrng._versions.TESTED_TORCH (doctor: 'not a release devrng is tested with') is the
    set of torch minors the test environments pin."""
    tested = sorted({_release(pins["torch"])[:2] for pins in TEST_ENVS.values()})
    assert tested == sorted(TESTED_TORCH)
    assert _release(_lowest(_parse(PROJECT["dependencies"][0])[1]))[:2] == MIN_TORCH


@pytest.mark.parametrize("env", sorted(ENVS))
def test_doctor_finds_no_version_problem_in_what_ci_installs(env: str) -> None:
    # Import names, as doctor reads them (intel-extension-for-pytorch -> intel_extension_for_pytorch).
    versions = {name.replace("-", "_"): version for name, version in ENVS[env].items()}
    errors = [p.text for p in version_problems(versions) if p.error]
    assert not errors, f"envs/{env}.txt: {errors}"


@pytest.mark.parametrize("extra", ["xla", "torchax", "ipex"])
def test_device_extras_pin_the_torch_their_package_imports_with(extra: str) -> None:
    """A device package's wheel does not declare the torch it is built for: its extra pins
    one torch minor, the one an environment tests the package with, and doctor's table
    accepts the pair."""
    specs = dict(_parse(r) for r in PROJECT["optional-dependencies"][extra])
    torch_spec = specs.pop("torch")
    assert len(torch_spec) == 1 and torch_spec[0][0] == "==" and torch_spec[0][1].endswith(".*")
    minor = torch_spec[0][1][:-2]
    homes = [env for env, pins in TEST_ENVS.items() if all(name in pins for name in specs)]
    assert homes and all(_admits(torch_spec, ENVS[env]["torch"]) for env in homes), (
        f"the {extra} extra pins torch {minor}.*; CI tests it with "
        f"{[ENVS[env]['torch'] for env in homes]}")
    for name, package_specs in specs.items():
        pinned = [v for op, v in package_specs if op == "=="]
        if name in ("torch-xla", "intel-extension-for-pytorch"):  # X.Y needs torch X.Y.*
            assert pinned == [minor + ".*"], f"{name}: {package_specs}, torch {minor}.*"


def test_doctors_fix_for_torchax_without_jax_is_the_torchax_extras_jax_and_flax() -> None:
    (problem,) = [p for p in version_problems({"torch": "2.9.0", "torchax": "0.0.13",
                                              "numpy": "2.4.6"}) if p.package == "torchax"]
    wanted = [r for r in PROJECT["optional-dependencies"]["torchax"]
              if _parse(r)[0] in ("jax", "flax")]
    assert problem.fix == "pip install " + " ".join(f"'{r}'" for r in wanted)


def test_doctor_catches_each_device_extra_beside_the_torch_of_a_plain_install() -> None:
    """What issue 32 saw: `pip install .` then `pip install ".[xla]"` without the pin leaves
    torch_xla 2.9 beside the newest torch; doctor names it an error."""
    newest = ENVS["core"]["torch"]
    for extra, package in (("xla", "torch_xla"), ("torchax", "torchax"),
                           ("ipex", "intel_extension_for_pytorch")):
        home = next(pins for env, pins in TEST_ENVS.items()
                    if _name(package) in pins or package in pins)
        version = home.get(_name(package)) or home[package]
        problems = version_problems({"torch": newest, package: version, "numpy": "2.4.6",
                                     "jax": "0.10.2", "flax": "0.12.8"})
        assert any(p.error and p.package == package for p in problems), (extra, problems)


def test_python_claims_agree_with_each_other_and_admit_this_python() -> None:
    lowest = _lowest(PYTHON_SPECS)
    assert PYPROJECT["tool"]["mypy"]["python_version"] == lowest
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")
    running = ".".join(map(str, sys.version_info[:3]))
    assert _admits(PYTHON_SPECS, running)


@pytest.mark.parametrize("extra", sorted(PROJECT["optional-dependencies"]))
def test_every_extra_is_installed_together_by_one_env_file(extra: str) -> None:
    # Some env file pins every package the extra names, at versions the extra admits,
    # next to a torch that devrng's own dependency admits.
    wanted = [_parse(r) for r in PROJECT["optional-dependencies"][extra]]
    torch_specs = _parse(PROJECT["dependencies"][0])[1]
    homes = [env for env, pins in ENVS.items()
             if all(name in pins and _admits(specs, pins[name]) for name, specs in wanted)
             and _admits(torch_specs, pins["torch"])]
    assert homes, (f"no envs/*.txt installs the {extra!r} extra "
                   f"({PROJECT['optional-dependencies'][extra]}) together: CI never tests it")


def test_torchax_extra_brings_what_import_torchax_needs() -> None:
    # torchax 0.0.13 declares no dependencies but imports jax and flax at import time.
    names = {_parse(r)[0] for r in PROJECT["optional-dependencies"]["torchax"]}
    assert {"torchax", "jax", "flax"} <= names


def test_installed_extras_need_no_newer_python_than_devrng_claims() -> None:
    # A package of an extra that needs a newer Python than devrng admits breaks the extra there.
    lowest = _lowest(PYTHON_SPECS)
    checked = 0
    for requirement in [*PROJECT["dependencies"],
                        *(r for rs in PROJECT["optional-dependencies"].values() for r in rs)]:
        name = _parse(requirement)[0]
        try:
            needs = importlib.metadata.metadata(name).get("Requires-Python") or ""
        except importlib.metadata.PackageNotFoundError:
            continue
        checked += 1
        floors = [v for _, v in re.findall(r"(>=|>)\s*([\d.]+)", needs)]
        # 3.11.0 and 3.11 are the same floor: compare through _admits, which pads.
        assert all(_admits([("<=", lowest)], floor) for floor in floors), (
            f"{name} needs Python {needs}; devrng claims {PROJECT['requires-python']}")
    assert checked  # torch at least is installed wherever the suite runs


@pytest.mark.parametrize(("specs", "version", "ok"), [
    ([(">=", "2.8")], "2.8.0", True), ([(">=", "2.8")], "2.7.1", False),
    ([("==", "2.8.*")], "2.8.0+cpu", True), ([("==", "2.8.*")], "2.9.0", False),
    ([("<", "2.13")], "2.13.0", False), ([("<", "2.13")], "2.9.0", True),
    ([(">=", "3.11")], "3.11.7", True), ([(">=", "3.11")], "3.10.14", False),
    ([("<=", "3.11")], "3.11.0", True), ([("<=", "3.11")], "3.12", False),
])
def test_the_version_checks_of_this_file(specs: list[tuple[str, str]], version: str,
                                         ok: bool) -> None:
    assert _admits(specs, version) is ok


# -- the version, written once -------------------------------------------------------------
def _written_version() -> str:
    """``VERSION`` as src/devrng/_base/version.py writes it (read, not imported)."""
    import ast

    path = ROOT / "src" / Path(*VERSION_ATTR.split(".")[:-1]).with_suffix(".py")
    module = ast.parse(path.read_text())
    (value,) = [node.value.value for node in module.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["VERSION"]
                and isinstance(node.value, ast.Constant)]
    return str(value)


def _newest_release(changelog: str) -> str:
    """The newest released entry of a Keep a Changelog file (``## [X.Y.Z] - YYYY-MM-DD``)."""
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, flags=re.M)
    assert released, "CHANGELOG.md has no released entry"
    return released[0]


def test_the_version_is_written_once_and_everything_shows_that_one() -> None:
    """pyproject.toml reads the version from the one module that writes it; `devrng --version`,
    CHANGELOG.md's newest release and the docs' wheel file name show the same."""
    version = _written_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{version!r} is not a semantic version"
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": VERSION_ATTR}
    shown = subprocess.run([sys.executable, "-m", "devrng", "--version"], capture_output=True,
                           text=True, env={"PATH": os.environ.get("PATH", ""),
                                           "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert shown.stdout.strip() == f"devrng {version}", shown.stdout + shown.stderr
    assert _newest_release((ROOT / "CHANGELOG.md").read_text(encoding="utf-8")) == version
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        named = set(re.findall(r"dist/devrng-([\w.]+)-\*\.whl", page.read_text(encoding="utf-8")))
        assert named == {version}, f"{page.name} names the wheel of {named}, not {version}"
    # Every saved form says the devrng that wrote it: this one.
    from tests._helpers import plain_state

    import devrng

    streams = devrng.RNGStreams()
    streams.add("a", 1)
    saved = [plain_state(state) for state in (devrng.TrainingRNG(seed=1).state_dict(),
                                              devrng.portable(1).state_dict(),
                                              streams.state_dict())]
    saved.append(devrng.get_rng_state().to_dict())
    assert [state["devrng_version"] for state in saved] == [version] * len(saved)


@pytest.mark.parametrize(("changelog", "newest"), [
    ("## [Unreleased]\n\n## [0.5.0] - 2027-01-02\n\n## [0.4.0] - 2026-11-27\n", "0.5.0"),
    ("## [0.4.0] - 2026-11-27\n### Added\n- [0.9.9] - 2030-01-01 in a line\n", "0.4.0"),
])
def test_the_newest_release_is_read_from_the_changelog(changelog: str, newest: str) -> None:
    assert _newest_release(changelog) == newest


def test_the_python_releases_claimed_are_the_ones_whose_bytecode_is_tested() -> None:
    """The classifiers name exactly the bytecode module's TESTED, the lowest of which is
    requires-python's floor and the limited API the kernel is built against (setup.py)."""
    claimed = sorted(tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
                     for c in PROJECT["classifiers"]
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert claimed == sorted(bytecode.TESTED)
    lowest = ".".join(map(str, claimed[0]))
    assert _lowest(PYTHON_SPECS) == lowest
    setup = (ROOT / "setup.py").read_text()
    assert f"LOWEST_PYTHON = ({claimed[0][0]}, {claimed[0][1]})" in setup
    assert "Programming Language :: Python :: Implementation :: CPython" in PROJECT["classifiers"]


def test_cibuildwheel_builds_one_abi3_wheel_and_tests_it_on_every_supported_python() -> None:
    cibw = PYPROJECT["tool"]["cibuildwheel"]
    assert cibw["build"] == [f"cp{m}{n}-*" for m, n in bytecode.TESTED]
    assert cibw["test-command"] == f"python -m {KERNEL_PROOF}"
    assert cibw["linux"]["archs"] == ["x86_64", "aarch64"]
    assert cibw["macos"]["archs"] == ["arm64", "x86_64"]
    assert cibw["windows"]["archs"] == ["AMD64"]
