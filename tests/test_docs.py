"""The documentation as a user meets it: the built site, and the install story.

Builds the site with ProperDocs (the core environment has it) and inspects the HTML of
the API reference and the guides for what once went wrong: Sphinx roles shown
literally, examples rendered as nested blockquotes, torch's private parameters in
signatures, overloads repeated, and the objects users get back left undocumented.
The install commands are read from the Markdown sources: the README and every docs
page give the same ones, and those work as written. Every ``python`` block of every page
runs as copied or says it is a fragment (tests/_docblocks.py has the rule;
tests/test_examples.py runs the blocks that run).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tests._docblocks import FRAGMENT, PAGES, python_blocks, rule_broken

import devrng

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("properdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "properdocs", "build", "--strict",
                            "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stdout + build.stderr
    # A build says what it did and nothing else: no banner, no warning, no notice to act on.
    said = [line for line in (build.stdout + build.stderr).splitlines() if line.strip()]
    assert [line.split()[0] for line in said] == ["INFO"] * len(said), said
    return out


def _pages(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("index.html")}


def test_no_sphinx_roles_are_shown_literally(site: Path) -> None:
    for name, html in _pages(site).items():
        assert not re.search(r":(func|class|meth|attr|mod):`", html), name


def test_powers_written_with_two_stars_are_not_read_as_bold(site: Path) -> None:
    # "2**10 to 2**24" in prose is Markdown's bold from the first "**" to the next: the page
    # showed "2<strong>10 to 2</strong>24". Prose writes them 2\*\*10 (or in code).
    for name, html in _pages(site).items():
        assert not re.search(r"\d</?(strong|em)>\d", html), name


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


def test_plain_code_spans_in_docstrings_link_to_what_they_name(site: Path) -> None:
    """Docstrings write ``fork_rng`` (clean in help()); the site turns it into a link."""
    api = (site / "api" / "index.html").read_text()
    section = api[api.find('id="devrng.get_rng_state"'):api.find('id="devrng.set_rng_state"')]
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#devrng.fork_rng"', section)
    section = api[api.find('id="devrng.RNGState.load"'):api.find('id="devrng.RNGState.fingerprint"')]
    assert 'href="#devrng.RNGState.save"' in section
    text = re.sub(r"<[^>]+>", "", api)
    assert "][" not in text  # no link syntax left unresolved


def test_api_page_shows_fork_rng_by_use_and_each_module_heading_once(site: Path) -> None:
    api = (site / "api" / "index.html").read_text()
    heading = api[api.find('id="devrng.fork_rng"'):api.find("</h3>", api.find('id="devrng.fork_rng"'))]
    assert "doc-symbol-class" not in heading
    assert "doc-label-context" in heading and "doc-label-decorator" in heading
    headings = [" ".join(re.sub(r"<[^>]+>|&para;", " ", h).split())
                for _, h in re.findall(r"<h([2-6])[^>]*>(.*?)</h\1>", api, flags=re.S)]
    for module in ("devrng.testing", "devrng.distributed"):
        shown = [h for h in headings if h.removeprefix("module ") == module]
        assert len(shown) == 1, shown


def test_signatures_are_formatted_to_the_column(site: Path) -> None:
    """mkdocstrings formats signatures with ruff (the docs extra brings it): one per line."""
    api = (site / "api" / "index.html").read_text()
    start = api.find('id="devrng.deterministic"')
    signature = api[api.find("doc-signature", start):api.find("</code>", api.find("doc-signature", start))]
    lines = re.sub(r"<[^>]+>", "", signature).splitlines()
    assert len(lines) > 3 and max(len(line) for line in lines) <= 80, lines


def test_the_site_wraps_long_code_lines_instead_of_cutting_them(site: Path) -> None:
    css = (site / "stylesheets" / "extra.css").read_text()
    assert re.search(r"pre > code \{[^}]*white-space: pre-wrap", css)
    assert 'href="../stylesheets/extra.css"' in (site / "api" / "index.html").read_text()
    # A wrapped line's continuation is marked (a bar from its second line down), so that the
    # rest of a long comment does not read as a line of code.
    line = re.search(r'span\[id\^="__span"\] \{([^}]*)\}', css)
    assert line and "text-indent: -4ch" in line[1] and "transparent calc(1lh" in line[1]
    assert "min-width: 0" in line[1]  # a grid item: without it a long token widens the block


def test_code_in_a_table_cell_breaks_only_between_its_pieces(site: Path) -> None:
    """A phone's column once split `devrng.fork_rng(devices=[x])` as `devrng.fork_r` /
    `ng(...)`: each piece of code in a cell is kept whole and may break only after `.`,
    `(`, `,`, `=` (docs/_hooks/tables.py), and no rule lets a cell break inside a word."""
    home = (site / "index.html").read_text()
    assert ('<code><span class="nobr">devrng.</span><wbr><span class="nobr">fork_rng(</span><wbr>'
            '<span class="nobr">devices=</span><wbr><span class="nobr">[x])</span></code>') in home
    css = (site / "stylesheets" / "extra.css").read_text()
    assert re.search(r"table:not\(\[class\]\) code \.nobr \{\s*white-space: nowrap", css)
    assert "anywhere" not in css


def test_a_phone_reads_each_table_row_as_a_labelled_card(site: Path) -> None:
    """Every body cell carries its column's heading, which the phone layout shows before it."""
    page = (site / "reproducible-training" / "index.html").read_text()
    table = page[page.find("<table>"):page.find("</table>")]
    headings = re.findall(r"<th[^>]*>(.*?)</th>", table)
    first_row = re.findall(r'<td data-label="([^"]*)"', table)[:len(headings)]
    assert headings and first_row == [re.sub(r"<[^>]+>", "", h) for h in headings]
    css = (site / "stylesheets" / "extra.css").read_text()
    assert 'content: attr(data-label) ": "' in css
    phone = css[css.find("@media screen and (max-width: 44.9375em)"):]
    assert re.search(r"table:not\(\[class\]\) > thead \{\s*display: none", phone)


def test_a_phone_gets_benchmark_charts_drawn_for_its_column(site: Path) -> None:
    page = (site / "benchmarks" / "index.html").read_text()
    for env in ("bench", "xla"):
        assert (f'<source media="(max-width: 44.9375em)" srcset="../benchmarks-{env}-narrow.png">'
                in page)
        assert (site / f"benchmarks-{env}-narrow.png").is_file()


# -- install commands ----------------------------------------------------------------------
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_FENCED = re.compile(r"^[ \t]*```(?:bash|shell|console|sh)?\n(.*?)^[ \t]*```", flags=re.M | re.S)
_COMMAND = re.compile(r"^\s*(pip (?:install|wheel)\b[^#\n]*?)\s*(?:#.*)?$", flags=re.M)
_INLINE = re.compile(r"(?<!`)`(pip (?:install|wheel)\b[^`]*)`(?!`)")


def install_commands(markdown: str) -> list[str]:
    """Every pip command in fenced blocks and inline code, comments dropped, in order."""
    found = [c for block in _FENCED.findall(markdown) for c in _COMMAND.findall(block)]
    outside = _FENCED.sub("", markdown)
    return found + [c.strip() for c in _INLINE.findall(outside)]


def install_section(markdown: str) -> list[str]:
    section = markdown.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return install_commands(section)


CANONICAL = install_section((DOCS / "index.md").read_text(encoding="utf-8"))
SOURCES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_install_commands_are_found() -> None:
    sample = ('```bash\npip install .      # devrng\n  pip install ".[xla]"\n```\n'
              'Or `pip install devrng`, not ``code``.')
    assert install_commands(sample) == ["pip install .", 'pip install ".[xla]"',
                                        "pip install devrng"]
    assert "pip install ." in CANONICAL and len(CANONICAL) >= 5


def test_readme_and_site_show_the_same_install_commands() -> None:
    readme = install_section((ROOT / "README.md").read_text(encoding="utf-8"))
    assert readme == CANONICAL


def installs_devrng(command: str) -> bool:
    """Whether a pip command installs devrng (its source tree, an extra, its wheel, or by
    name) rather than a package beside it (``pip install 'torch==2.9.*'``)."""
    return any(word.strip("\"'") in (".", "devrng") or word.strip("\"'").startswith((".[", "dist/"))
               for word in command.split()[2:])


def test_devrng_installs_are_told_apart_from_other_installs() -> None:
    assert installs_devrng('pip install ".[xla]"') and installs_devrng("pip install .")
    assert installs_devrng("pip install devrng") and installs_devrng("pip wheel --no-deps -w dist .")
    assert not installs_devrng("pip install 'torch==2.9.*'")
    assert not installs_devrng("pip install numpy")


@pytest.mark.parametrize("page", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_every_install_command_is_one_of_the_install_section(page: Path) -> None:
    """One install story: no page tells users to install devrng any other way."""
    stray = [c for c in install_commands(page.read_text(encoding="utf-8"))
             if installs_devrng(c) and c not in CANONICAL]
    assert not stray, f"{page.name}: {stray} (the Install section of docs/index.md has {CANONICAL})"


_CPU_TORCH = re.compile(r'pip install (torch|"torch==(\d+\.\d+)\.\*") '
                        r"--index-url https://download\.pytorch\.org/whl/cpu")


def test_install_commands_work_as_written() -> None:
    """devrng is not on a package index: every command installs from the source tree (``.``,
    an extra of it, or the wheel built from it), and names only extras and files that exist;
    the one other is a CPU-only torch from PyTorch's index, at a release an extra pins."""
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    pinned = {r.split("==")[1][:-2] for rs in PYPROJECT["project"]["optional-dependencies"].values()
              for r in rs if r.startswith("torch==")}
    # The wheel carries the compiled kernel, so its tags are the platform's: a glob.
    wheel = f"dist/{PYPROJECT['project']['name']}-{devrng.__version__}-*.whl"
    cpu_torch = [c for c in CANONICAL if _CPU_TORCH.fullmatch(c)]
    assert cpu_torch and {m for c in cpu_torch if (m := _CPU_TORCH.fullmatch(c)[2])} <= pinned  # type: ignore[index]
    for command in CANONICAL:
        target = command.split()[-1].strip("\"'")
        if command in cpu_torch:
            continue
        if command.startswith("pip wheel"):
            assert command == "pip wheel --no-deps -w dist .", command
        elif target.startswith(".["):
            assert target[2:-1] in extras, f"{command}: pyproject.toml has no such extra"
        else:
            assert target in (".", wheel), f"{command}: installs {target!r}, not the source tree"
    assert f"pip install {wheel}" in CANONICAL  # the wheel the build command makes


def test_a_returns_section_renders_as_one_description(site: Path) -> None:
    """A Returns: description that takes two lines is one item, not two return values."""
    api = (site / "api" / "index.html").read_text()
    for ident in ("devrng.fork_rng", "devrng.deterministic", "devrng.get_backend"):
        start = api.find(f'id="{ident}"')
        section = api[api.find("Returns:", start):]
        items = section[:section.find("</ul>")].count("<li")
        assert items == 1, (ident, items)


# -- python blocks: each runs as copied, or says it is a fragment ---------------------------
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_block_runs_as_copied_or_says_it_is_a_fragment(page: Path) -> None:
    broken = [f"{b.where} {why}" for b in python_blocks(page) if (why := rule_broken(b.code))]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(("code", "why"), [
    # docs/fork-rng.md's first block in round 4: imports, then a name from nowhere.
    ("import devrng\n\nwith devrng.fork_rng(devices=[batch]):\n    pass\n",
     "a program that uses ['batch'] without defining"),
    ("import devrng\n\n@devrng.fork_rng()\ndef f(x): ...\n", "neither starts with its imports"),
    # its second: a signature tagged python.
    ('fork_rng(devices=None, _caller="fork_rng", *, python=False)\n', "is not valid Python"),
    ("snap = devrng.get_rng_state(devices=[model])\n", "neither starts with its imports"),
    (f"{FRAGMENT} model: yours\nout = model(batch)\n", "does not say where ['batch'] come from"),
    (">>> devrng.manual_seed(0)\n0\n", "a console block that uses ['devrng']"),
])
def test_the_block_rule_catches_each_way_to_break_it(code: str, why: str) -> None:
    assert why in (rule_broken(code) or "")


@pytest.mark.parametrize("code", [
    "import torch\n\nx = torch.ones(2)\nprint([v for v in x], __name__)\n",
    f"{FRAGMENT} model, batch: yours\nwith devrng.fork_rng(devices=[batch]):\n    model(batch)\n",
    ">>> import devrng\n>>> devrng.manual_seed(0)\n0\n",
    "from pathlib import Path\n\ndef f(p, *rest, key=None):\n    try:\n        return Path(p)\n"
    "    except OSError as err:\n        return err\n",
])
def test_the_block_rule_passes_blocks_that_keep_it(code: str) -> None:
    assert rule_broken(code) is None
