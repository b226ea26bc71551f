"""`devrng doctor` and `devrng selftest`, run as a user runs them."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._fakes import MinimalBackend, registered
from tests._helpers import fake_distribution, install_plugin, run_env, run_python
from tests._internals import (
    TESTED_TORCH,
    environment_problems,
    known_problems,
    version_problems,
    why_not_imported,
)

import devrng
from devrng.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str | None] | None = None
        ) -> subprocess.CompletedProcess[str]:  # as a user runs it
    return run_python("devrng", module=True, args=args, env=env)


def test_selftest_passes_and_prints_a_table() -> None:
    out = cli("selftest")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["backend", "check", "result"]
    assert any(line.split()[:3] == ["cpu", "fork", "pass"] for line in lines)
    assert "0 failed" in lines[-1]


def test_selftest_fails_with_exit_1_on_a_broken_backend(capsys: Any) -> None:
    class Forgetful(MinimalBackend):
        name = "forgetful"

        def set_rng_state(self, state: Any, index: int) -> None:
            pass  # loses the state: every round trip must fail

    with registered("forgetful", Forgetful()):
        assert main(["selftest"]) == 1
    out = capsys.readouterr().out
    assert "forgetful  snapshot    FAIL" in out or "FAIL" in out.split("forgetful")[1]


def test_doctor_prints_every_section() -> None:
    out = cli("doctor")
    assert out.returncode == 0, out.stderr
    for heading in ("Packages:", "Backends", "Determinism settings:", "Environment variables:",
                    "Known problems of the installed versions:"):
        assert heading in out.stdout
    assert "CUBLAS_WORKSPACE_CONFIG" in out.stdout


@pytest.mark.parametrize(("versions", "needle"), [
    ({"torch": "2.9.0"}, "forks 'cuda' by default"),
    ({"torch": "2.13.0", "torchax": "0.0.13"}, "bakes the PRNG key"),
    ({"torch": "2.13.0", "torch_xla": "2.9.0"}, "torch.manual_seed does not seed XLA"),
    ({"torch": "2.8.0", "intel_extension_for_pytorch": "2.8.0"}, "no longer developed"),
])
def test_known_problems_follow_installed_versions(versions: dict[str, str], needle: str) -> None:
    assert any(needle in line for line in known_problems(versions))  # type: ignore[arg-type]


def test_no_known_problems_for_a_clean_new_torch() -> None:
    assert known_problems({"torch": "2.13.0"}) == []


# -- versions that do not work together ----------------------------------------------------
_JAX = {"jax": "0.10.2", "flax": "0.12.8", "numpy": "2.4.6"}


@pytest.mark.parametrize(("versions", "text", "fix"), [
    ({"torch": "2.14.1", "torch_xla": "2.9.0"},
     "torch_xla 2.9.0 needs torch 2.9.*, and torch 2.14.1 is installed: `import torch_xla` fails "
     "with an undefined symbol", "pip install 'torch==2.9.*'"),
    ({"torch": "2.9.0+cu128", "torch_xla": "2.8.1"}, "torch_xla 2.8.1 needs torch 2.8.*",
     "pip install 'torch==2.8.*'"),
    ({"torch": "2.13.0", "intel_extension_for_pytorch": "2.8.0"},
     "intel_extension_for_pytorch 2.8.0 needs torch 2.8.*, and torch 2.13.0 is installed",
     "pip install 'torch==2.8.*'"),
    ({"torch": "2.13.0", "torchax": "0.0.13", **_JAX},
     "torchax 0.0.13 needs torch older than 2.13 (CI tests it with 2.9)",
     "pip install 'torch==2.9.*'"),
    ({"torch": "2.9.0", "torchax": "0.0.13", "numpy": "2.4.6"},
     "torchax 0.0.13 imports jax and flax, and jax and flax are not installed: torchax's "
     "package does not declare them", "pip install 'jax>=0.10' 'flax>=0.12.8'"),
    ({"torch": "2.9.0", "torchax": "0.0.13", "jax": "0.10.2", "numpy": "2.4.6"},
     "and flax is not installed", "pip install 'jax>=0.10' 'flax>=0.12.8'"),
    ({"torch": "2.7.1", "numpy": "2.4.6"}, "torch 2.7.1 is older than devrng supports",
     "pip install 'torch>=2.8'"),
    ({}, "torch is not installed", "pip install torch"),
])
def test_versions_that_do_not_work_together_are_errors_with_a_fix(
        versions: dict[str, str], text: str, fix: str) -> None:
    problems = version_problems(versions)
    assert [(p.error, p.fix) for p in problems if text in p.text] == [(True, fix)], problems


def test_an_untested_torch_and_a_missing_numpy_are_named_but_not_errors() -> None:
    (untested,) = version_problems({"torch": "2.11.0", "numpy": "2.4.6"})
    newest = ".".join(map(str, TESTED_TORCH[-1]))
    assert not untested.error and untested.text.startswith(
        "torch 2.11.0 is not a release devrng is tested with (2.8, 2.9, 2.13, 2.14)")
    assert untested.fix == f"pip install 'torch=={newest}.*'"
    (numpy,) = version_problems({"torch": "2.13.0"})
    assert not numpy.error and "Failed to initialize NumPy" in numpy.text
    assert numpy.fix == "pip install numpy"


@pytest.mark.parametrize("versions", [
    {"torch": "2.9.0+cu128", "torch_xla": "2.9.0", "torchax": "0.0.13", **_JAX},
    {"torch": "2.8.0", "intel_extension_for_pytorch": "2.8.0", "numpy": "1.26.4"},
    {"torch": "2.14.1+cu130", "numpy": "2.4.6"},
    {"torch": "2.12.0", "torchax": "0.0.14", **_JAX},  # a newer torchax: not known to break
])
def test_versions_that_work_together_are_no_problem(versions: dict[str, str]) -> None:
    assert not [p for p in version_problems(versions) if p.error]


def test_doctor_diagnoses_a_device_package_built_for_another_torch(tmp_path: Path) -> None:
    """A torch_xla 2.9 wheel beside torch 2.14 (what `pip install torch_xla` did to a plain
    install): faked as pip would lay it out, first on the path -- the metadata of torch 2.14.1
    and of torch_xla 2.9.0, whose import fails as the real one does."""
    fake_distribution(tmp_path, "torch", "2.14.1")
    env = fake_distribution(tmp_path, "torch_xla", "2.9.0", package_source=(
        "raise ImportError('/venv/lib/python3.11/site-packages/_XLAC.cpython-311-x86_64-linux-"
        "gnu.so: undefined symbol: _ZN5torch8autograd10deleteNodeEPNS0_4NodeE')\n"))
    out = cli("doctor", "--load", env={**env, "PJRT_DEVICE": "CPU"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "_ZN5torch" not in out.stdout and "undefined symbol: " not in out.stdout
    assert "Traceback" not in out.stderr
    row = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["xla"])
    assert row.split()[1:4] == ["torch_xla", "2.9.0", "FAIL"]
    assert "torch_xla 2.9.0 does not import with torch 2.14.1: the fix is under 'Problems" in row
    problems = out.stdout.split("Problems in this environment:")[1].splitlines()
    at = next(i for i, line in enumerate(problems) if "torch_xla 2.9.0 needs torch 2.9.*" in line)
    assert problems[at].startswith("  - ERROR: torch_xla 2.9.0 needs torch 2.9.*, and torch "
                                   "2.14.1 is installed")
    assert problems[at + 1] == "    run: pip install 'torch==2.9.*'"


@pytest.mark.parametrize(("error", "says"), [
    (ImportError("_XLAC.so: undefined symbol: _ZN5torch8autograd10deleteNodeEPNS0_4NodeE"),
     "torch_xla 2.13.0 does not import: its compiled library was built against another torch "
     "than the installed 2.13.0; reinstall torch_xla for this torch"),
    (ModuleNotFoundError("No module named 'jax'", name="jax"),
     "torch_xla 2.13.0 does not import: it needs the module 'jax', which is not installed "
     "(run: pip install jax)"),
    (RuntimeError("PJRT init failed\nsecond line"),
     "torch_xla 2.13.0 is installed but failed to import: RuntimeError: PJRT init failed"),
])
def test_a_failed_import_the_table_does_not_explain_is_still_a_sentence(
        error: Exception, says: str) -> None:
    # torch_xla of the installed torch's own release: no version problem explains the failure.
    versions = {"torch": "2.13.0", "torch_xla": "2.13.0", "numpy": "2.4.6"}
    assert why_not_imported("torch_xla", error, versions) == says


# -- manners ------------------------------------------------------------------------
def test_no_command_prints_help_and_succeeds() -> None:
    out = cli()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: devrng")
    assert "doctor" in out.stdout and "selftest" in out.stdout


def test_version_and_help_do_not_import_torch() -> None:
    code = ("import sys\n"
            "from devrng.__main__ import main\n"
            "for argv in (['--version'], ['--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exit:\n"
            "        assert exit.code == 0, exit.code\n"
            "print('torch imported:', 'torch' in sys.modules)\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert f"devrng {devrng.__version__}\n" in out.stdout
    assert out.stdout.strip().endswith("torch imported: False")


def test_doctor_into_a_closed_pipe_exits_quietly() -> None:
    proc = subprocess.run(f"{sys.executable} -m devrng doctor | head -1", shell=True,
                          capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PJRT_DEVICE": "CPU"})
    assert proc.stdout.startswith("devrng ")
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_doctor_onto_a_full_disk_says_so_in_one_line() -> None:
    with open("/dev/full", "w") as full:
        proc = run_python("devrng", module=True, args=["doctor"], stdout=full)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("devrng")]
    assert lines == ["devrng doctor: could not write the report (No space left on device)."]
    assert "Traceback" not in proc.stderr


def test_doctor_rows_say_one_thing_each() -> None:
    out = cli("doctor").stdout
    backends = out.split("Backends", 1)[1].split("Determinism settings:")[0]
    rows = [line.split() for line in backends.splitlines()[2:] if line.startswith("  ")
            and not line.startswith("  (")]
    for row in rows:  # a package that is not installed is never "not loaded" as well
        assert not ("(not" in row and "installed)" in row and "loaded" in row), row
    assert "torch.initial_seed()" not in out
    assert "(False, False)" not in out and "(True, False)" not in out
    assert "torch.use_deterministic_algorithms" in out
    if not torch.backends.cuda.is_built():  # a device type this build cannot have
        assert "not listed: cuda (this torch is built without CUDA)" in backends


def test_selftest_lists_what_it_did_not_test_and_why() -> None:
    out = cli("selftest").stdout
    assert "Not tested here:" in out
    if not torch.backends.mps.is_built():
        assert "mps: this torch is built without MPS" in out


@pytest.mark.xla
def test_doctor_load_checks_xla_and_warns_about_pjrt_device() -> None:
    pytest.importorskip("torch_xla")
    loaded = cli("doctor", "--load")
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    row = next(line for line in loaded.stdout.splitlines() if line.split()[:1] == ["xla"])
    assert "works (" in row and "a draw and a state round trip" in row
    unset = cli("doctor", env={"PJRT_DEVICE": None})
    assert "PJRT_DEVICE is not set" in unset.stdout
    row = next(line for line in unset.stdout.splitlines() if line.split()[:1] == ["xla"])
    assert "not loaded" in row and "--load" in row
    # torch_xla's import sets PJRT_DEVICE (and XLA_FLAGS) itself: listed as what loading did
    loaded_unset = cli("doctor", "--load", env={"PJRT_DEVICE": None, "XLA_FLAGS": None})
    assert "  PJRT_DEVICE               (unset)  (loading the backends set it to 'CPU')" \
        in loaded_unset.stdout
    assert "PJRT_DEVICE is not set" in loaded_unset.stdout


@pytest.mark.xla
def test_selftest_turns_a_failing_backend_into_a_fail_row() -> None:
    pytest.importorskip("torch_xla")
    out = cli("selftest", env={"PJRT_DEVICE": "NOPE"})
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    xla_rows = [line for line in out.stdout.splitlines() if line.startswith("xla ")]
    assert xla_rows and all("FAIL" in line for line in xla_rows)
    assert any(line.split()[:3] == ["cpu", "seed", "pass"] for line in out.stdout.splitlines())


# -- torch_xla's copy of torchax ---------------------------------------------------------
_TORCHAX_COPY = ("raise ModuleNotFoundError(\"No module named 'jax'\", name='jax')\n")


def _backend_row(doctor: str, name: str) -> str:
    table = doctor.split("\nBackends")[1]
    return next(line for line in table.splitlines() if line.split()[:1] == [name])


def _torchax_copy_said(out: str) -> None:
    assert "only the copy of torchax that torch" in out and "not used" in out, out
    assert "devrng's torchax extra installs it" in out and "pip install jax" not in out, out


def test_doctor_and_selftest_name_a_torchax_copy_and_pass_over_it(tmp_path: Path) -> None:
    """torch_xla 2.9's wheel ships a torchax folder (listed in its RECORD only) that imports
    JAX, which nothing installed: faked here as pip lays it out. doctor --load exited 1 with
    'run: pip install jax' over it; a user who installed the xla extra never asked for it."""
    try:
        importlib.metadata.version("torchax")
        pytest.skip("torchax is installed here as a package of its own")
    except importlib.metadata.PackageNotFoundError:
        pass
    torch_release = torch.__version__.split("+")[0]  # no version problem to report
    env = fake_distribution(tmp_path, "torch_xla", torch_release)
    (tmp_path / f"torch_xla-{torch_release}.dist-info" / "RECORD").write_text(
        "torchax/__init__.py,,\n")
    (tmp_path / "torchax").mkdir()
    (tmp_path / "torchax" / "__init__.py").write_text(_TORCHAX_COPY)
    doctor = cli("doctor", "--load", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    row = _backend_row(doctor.stdout, "jax")
    assert row.split()[1:4] == ["torchax", "(not", "installed)"], row
    _torchax_copy_said(row)
    assert "only the copy of torchax that torch_xla ships" in row  # the owner is named
    selftest = cli("selftest", env=env)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
    _torchax_copy_said(selftest.stdout.split("Not tested here:")[1])
    # The copy is real to Python: importing it fails as torch_xla's does without JAX.
    assert "No module named 'jax'" in run_python("import torchax", env=env).stderr


@pytest.mark.xla
@pytest.mark.slow  # a new environment, and torch_xla loaded twice
def test_the_xla_extra_alone_gives_a_clean_doctor(tmp_path: Path) -> None:
    """`pip install ".[xla]"` alone, for real: this environment without the torchax
    distribution, JAX and flax (a new venv that sees everything else of it), leaves
    torch_xla's own copy of torchax."""
    pytest.importorskip("torch_xla")
    site = Path(torch.__file__).parent.parent
    owners = importlib.metadata.packages_distributions().get("torchax", [])
    if not any(o.replace("-", "_") == "torch_xla" for o in owners):
        pytest.skip("this torch_xla ships no torchax")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (target,) = venv.glob("lib/python*/site-packages")
    left_out = ("torchax-", "jax", "flax", "__editable__", "devrng")
    for entry in site.iterdir():
        if not entry.name.startswith(left_out):
            (target / entry.name).symlink_to(entry)
    python = str(venv / "bin" / "python")
    env = run_env()
    doctor = subprocess.run([python, "-m", "devrng", "doctor", "--load"], capture_output=True,
                            text=True, env=env, timeout=600)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "torchax                        -" in doctor.stdout  # the distribution is gone
    _torchax_copy_said(_backend_row(doctor.stdout, "jax"))
    assert "works (" in _backend_row(doctor.stdout, "xla")
    selftest = subprocess.run([python, "-m", "devrng", "selftest"], capture_output=True,
                              text=True, env=env, timeout=600)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
    _torchax_copy_said(selftest.stdout)


# -- the environment's settings ------------------------------------------------------------
def test_doctor_reports_a_seed_variable_that_is_no_seed_with_the_fix() -> None:
    out = cli("doctor", env={"DEVRNG_SEED": "abc"})
    assert out.returncode == 1, out.stdout + out.stderr
    problems = out.stdout.split("Problems in this environment:")[1]
    assert ("ERROR: The DEVRNG_SEED environment variable is 'abc', which is not a seed; set it "
            "to an int in [0, 2**64) or unset it.") in problems
    assert "TrainingRNG()" in problems
    fine = cli("doctor", env={"DEVRNG_SEED": "1234", "PL_GLOBAL_SEED": str(2**64)})
    assert fine.returncode == 1 and "PL_GLOBAL_SEED environment variable is" in fine.stdout
    assert "DEVRNG_SEED environment variable" not in fine.stdout
    clean = cli("doctor", env={"DEVRNG_SEED": "1234"})
    assert clean.returncode == 0 and "Problems in this environment" not in clean.stdout


@pytest.mark.parametrize("value", [":4096:8", ":16:8", ":0:0", ":8192:2", "4096:8"])
def test_doctor_and_deterministic_agree_on_cublas_workspace_config(
        value: str, simulate_device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor warns about exactly the values that deterministic() refuses once CUDA runs
    (SIMULATED CUDA: already initialised)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    errors, warned = environment_problems({})
    flagged = any(line.startswith(f"CUBLAS_WORKSPACE_CONFIG is {value!r}") for line in warned)
    assert not errors
    simulate_device("cuda", initialized=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ':16:8' is accepted with a warning
        try:
            with devrng.deterministic():
                refused = False
        except devrng.DevRNGError:
            refused = True
    assert flagged == refused
    assert refused == (value not in (":4096:8", ":16:8"))


def test_doctor_load_prints_what_packages_print_after_its_table(tmp_path: Path) -> None:
    """A backend package that warns while loading (Python warnings, or C++ writing to
    file descriptor 2) does not break into the table: its text comes after, marked."""
    env = install_plugin(tmp_path, "noisydev = noisy_mod:backend",
                         "import os, warnings\n"
                         "warnings.warn('noisy_mod is deprecated, says the package')\n"
                         "os.write(2, b'noisy C++ runtime: starting\\n')\n"
                         "from tests._fakes import MinimalBackend\n"
                         "backend = MinimalBackend()\nbackend.name = 'noisydev'\n")
    out = subprocess.run([sys.executable, "-m", "devrng", "doctor", "--load"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # as a terminal shows
                         env=run_env(env))
    lines = out.stdout.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.split()[:1] == ["noisydev"])
    assert "works (" in lines[table_end]
    noise = [i for i, line in enumerate(lines) if "noisy_mod is deprecated" in line
             or "noisy C++ runtime: starting" in line]
    assert len(noise) >= 2 and min(noise) > table_end, out.stdout  # the warning quotes its line
    heading = lines.index("Printed while loading the backends (by the packages themselves):")
    assert table_end < heading < min(noise)
    assert all(lines[i].startswith("  | ") for i in noise)


def test_doctor_load_lists_the_environment_the_user_set_not_what_loading_set(
        tmp_path: Path) -> None:
    """torch_xla's import sets PJRT_DEVICE and XLA_FLAGS itself (measured: torch_xla 2.9);
    doctor --load listed them as the user's and, PJRT_DEVICE set, dropped its warning that
    it is not. Faked here: a backend package that sets them while it loads, beside the
    metadata of a torch_xla."""
    env = install_plugin(tmp_path, "envdev = env_mod:backend",
                         "import os\n"
                         "os.environ['PJRT_DEVICE'] = 'CPU'\n"
                         "os.environ['XLA_FLAGS'] = ' --xla_cpu_enable_fast_math=false'\n"
                         "os.environ.pop('DEVRNG_CPU_KERNEL', None)\n"
                         "from tests._fakes import MinimalBackend\n"
                         "backend = MinimalBackend()\nbackend.name = 'envdev'\n")
    fake_distribution(tmp_path, "torch_xla", "2.9.0")
    out = cli("doctor", "--load", env={**env, "PJRT_DEVICE": None, "XLA_FLAGS": None,
                                       "DEVRNG_CPU_KERNEL": "auto"})
    variables = out.stdout.split("\nEnvironment variables:\n")[1].split("\n\n")[0]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in variables.splitlines()}
    assert rows["PJRT_DEVICE"] == "(unset)  (loading the backends set it to 'CPU')"
    assert rows["XLA_FLAGS"] == ("(unset)  (loading the backends set it to "
                                 "' --xla_cpu_enable_fast_math=false')")
    assert rows["DEVRNG_CPU_KERNEL"] == "auto  (loading the backends unset it)"
    assert rows["RANK"] == "(unset)"
    assert "torch_xla is installed but PJRT_DEVICE is not set" in out.stdout
    plain = cli("doctor", env={"PJRT_DEVICE": "TPU"})  # nothing changed it: nothing beside
    assert "  PJRT_DEVICE               TPU\n" in plain.stdout
    assert "loading the backends" not in plain.stdout


def test_environment_problems_read_the_environment_they_are_given() -> None:
    versions: dict[str, str | None] = {"torch_xla": "2.9.0"}
    _, unset = environment_problems(versions, {})
    assert any("PJRT_DEVICE is not set" in w for w in unset)
    _, given = environment_problems(versions, {"PJRT_DEVICE": "CPU"})
    assert not any("PJRT_DEVICE" in w for w in given)
