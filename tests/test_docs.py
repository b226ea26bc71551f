"""The built documentation site, read as a user's browser gets it.

Builds the site with mkdocs (the core environment has it) and inspects the HTML of
the API reference and the guides for what once went wrong: Sphinx roles shown
literally, examples rendered as nested blockquotes, torch's private parameters in
signatures, overloads repeated, and the objects users get back left undocumented.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def _pages(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("index.html")}


def test_no_sphinx_roles_are_shown_literally(site: Path) -> None:
    for name, html in _pages(site).items():
        assert not re.search(r":(func|class|meth|attr|mod):`", html), name


def test_examples_render_as_code_not_blockquotes(site: Path) -> None:
    api = (site / "api" / "index.html").read_text()
    assert "<blockquote>" not in api
    prompts = api.count('<span class="gp">&gt;&gt;&gt; </span>')
    assert prompts > 100  # every docstring example is a highlighted console block
    assert "&gt;&gt;&gt; " not in re.sub(r'<span class="gp">&gt;&gt;&gt; </span>', "", api)


def test_signatures_hide_torch_private_parameters_and_overloads(site: Path) -> None:
    api = (site / "api" / "index.html").read_text()
    assert "_caller" not in api and "_devices_kw" not in api
    start, end = api.find('id="devrng.seeded_jit"'), api.find('id="devrng.SeededFunction"')
    assert 0 < start < end
    assert api[start:end].count("doc-signature") == 1


@pytest.mark.parametrize("ident", [
    "devrng.DeterministicHandle.dataloader_kwargs", "devrng.DeterministicHandle.report",
    "devrng.DeterministicHandle.restore", "devrng.SeededFunction.compile_count",
    "devrng.SeededFunction.backend", "devrng.SeededFunction.state_dict",
    "devrng.SeededFunction.load_state_dict", "devrng.TrainingRNG.dataloader_kwargs",
    "devrng.TrainingRNG.track", "devrng.TrainingRNG.state_dict",
    "devrng.TrainingRNG.load_state_dict", "devrng.sample_rng", "devrng.RNGState.save",
])
def test_the_objects_users_get_back_are_documented(site: Path, ident: str) -> None:
    api = (site / "api" / "index.html").read_text()
    assert f'id="{ident}"' in api


def test_docstrings_do_not_send_users_to_private_modules(site: Path) -> None:
    api = (site / "api" / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", api)
    private = re.findall(r".{0,30}devrng\._[a-z]\w*.{0,10}", text)  # devrng.__all__ is public
    assert not private, private[:5]
