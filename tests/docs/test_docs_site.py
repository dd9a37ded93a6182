"""The documentation site: its sources are generated from the checkout and build in MkDocs' strict mode (a broken
link, a missing page or an API object that no longer exists fails the build); the built pages cover every method,
command, flag and public module; and a headless Chromium renders the home page, the catalogue (the 38 methods with
the statuses `rankwise list` prints, filterable) and a method page (its verdict table and plots that loaded).

Skipped, saying why, where the `docs` extra (pyproject.toml) or Chromium (docs/site_gen/get_chromium.sh) is absent.
Infrastructure: no method marker. The site is built once per session (about 20 s on one core)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE_GEN = ROOT / "docs" / "site_gen"
SCREENSHOTS = ROOT / "build" / "docs-screenshots"
METHOD_PAGE = "guardspace"  # a method whose report has a verdict table and plots

MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "websockets")
           if importlib.util.find_spec(m.split(".")[0]) is None
           or (m == "mkdocstrings_handlers.python" and importlib.util.find_spec(m) is None)]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (missing {MISSING}): "
                                "`.venv/bin/pip install -e '.[docs]'` or `make docs`")

sys.path.insert(0, str(SITE_GEN))


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "NO_MKDOCS_2_WARNING": "1"}


def _mkdocs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, generated into build/docs-src (mkdocs.yml's docs_dir) and built strict into a temporary folder."""
    gen = subprocess.run([sys.executable, str(SITE_GEN / "generate.py")], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    out = tmp_path_factory.mktemp("docs") / "site"
    build = _mkdocs("build", "--strict", "--site-dir", str(out))
    assert build.returncode == 0, f"strict build failed:\n{build.stderr[-4000:]}"
    return out


def test_strict_build_writes_every_page(site):
    from rankwise.registry import METHODS

    for page in ("index.html", "install.html", "catalogue.html", "cli.html", "api/index.html", "adapters.html",
                 "training.html", "contributing.html", "guides/mla.html", "guides/quantize.html"):
        assert (site / page).is_file(), page
    for m in METHODS:
        assert (site / "methods" / f"{m.slug}.html").is_file(), m.slug


def test_strict_mode_fails_on_a_broken_link(tmp_path):
    """The validation mkdocs.yml sets is what makes a broken link fatal: the same settings on a two-page site with
    one link to a page that does not exist must fail (and pass once the link is fixed)."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# home\n\n[a page](missing.md)\n")
    (docs / "other.md").write_text("# other\n")
    small = {"site_name": "t", "docs_dir": str(docs), "site_dir": str(tmp_path / "site"), "strict": True,
             "validation": config["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    assert config["strict"] is True
    assert _mkdocs("build", "-f", str(tmp_path / "mkdocs.yml"), cwd=tmp_path).returncode != 0
    (docs / "index.md").write_text("# home\n\n[a page](other.md)\n")
    assert _mkdocs("build", "-f", str(tmp_path / "mkdocs.yml"), cwd=tmp_path).returncode == 0


def test_api_reference_covers_every_public_module(site):
    import api_reference

    html = " ".join(p.read_text() for p in (site / "api").glob("*.html"))
    modules = api_reference.public_modules()
    assert len(modules) > 400  # the walk found the package, not an empty folder
    missing = [m for m in modules if f'id="{m}"' not in html]
    assert not missing, f"modules without an API section: {missing[:10]}"
    assert 'id="rankwise.adapters.lora.LoraAdapter"' in html  # members too, not only module headings


def test_cli_reference_lists_every_command_and_flag(site):
    import cli_reference

    from rankwise.cli import build_parser

    html = (site / "cli.html").read_text()
    found = cli_reference.commands(build_parser())
    assert len(found) > 10
    for words, parser in found:
        assert f'id="{"-".join(words) or "rankwise"}"' in html, words
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in html, f"rankwise {' '.join(words)}: {flag}"


def test_method_pages_embed_every_committed_report(site):
    from rankwise.registry import METHODS

    for m in METHODS:
        html = (site / "methods" / f"{m.slug}.html").read_text()
        assert m.status in html
        for e in m.experiments:
            report = ROOT / e.results_dir(m.slug) / "report.json"
            if not report.is_file():
                continue
            import json

            for claim in json.loads(report.read_text()).get("claims", []):
                assert claim["name"] in html, f"{m.slug}:{e.name}: claim {claim['name']} not on the page"
        for src in re.findall(r'<img[^>]+src="([^"]+)"', html):
            assert (site / "methods" / src).resolve().is_file(), f"{m.slug}: image {src} missing"


# -- in a real browser ----------------------------------------------------------------------------------------------

def _list_statuses() -> dict[str, tuple[str, str]]:
    """slug -> (family, status) as `rankwise list` prints them."""
    out = subprocess.run([sys.executable, "-m", "rankwise.cli", "list"], env=_env(), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    from rankwise.registry import BY_SLUG

    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in BY_SLUG:
            rows[parts[0]] = (parts[1], parts[2])
    return rows


@pytest.fixture(scope="module")
def browser(site):
    import browser as chromium

    found = chromium.find_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    with chromium.serve(site) as base, chromium.Browser(*found) as page:
        yield page, base


ROWS = """Array.from(document.querySelectorAll('article table tbody tr')).filter(r => !r.hidden)
          .map(r => [r.cells[0].textContent.trim(), r.cells[2].textContent.trim(), r.cells[3].textContent.trim()])"""


def test_home_page_renders(browser):
    page, base = browser
    page.goto(base + "index.html")
    assert page.js("document.querySelector('article h1').textContent.trim()").startswith("rankwise")
    # links and section labels of the primary navigation
    nav = page.js("""Array.from(document.querySelectorAll('nav.md-nav--primary .md-nav__link'))
                     .map(a => a.textContent.trim())""")
    for entry in ("Catalogue", "Command line", "API reference", "Installation", "Adding a method", "guardspace"):
        assert entry in nav, entry
    page.screenshot(SCREENSHOTS / "home.png")


def test_catalogue_lists_every_method_with_its_listed_status_and_filters(browser):
    page, base = browser
    listed = _list_statuses()
    assert len(listed) == 38
    page.goto(base + "catalogue.html")
    rows = page.js(ROWS)
    assert {slug: (family, status) for slug, family, status in rows} == listed
    page.screenshot(SCREENSHOTS / "catalogue.png")
    # the filters: the shown rows are exactly the listed methods of the chosen status, then family
    for key, column, value in (("status", 1, "implemented"), ("family", 0, "adapters")):
        page.js(f"""(() => {{ const s = document.querySelector('select[data-filter="{key}"]'); s.value = '{value}';
                    s.dispatchEvent(new Event('change')); }})()""")
        shown = {slug for slug, *_ in page.js(ROWS)}
        assert shown == {slug for slug, fs in listed.items() if fs[column] == value
                         and (key == "status" or fs[1] == "implemented")}, key
        assert f"{key}={value}" in page.js("window.location.search")


def test_method_page_shows_its_verdict_table_and_plots(browser):
    page, base = browser
    page.goto(base + f"methods/{METHOD_PAGE}.html")
    headers = page.js("Array.from(document.querySelectorAll('article table th')).map(th => th.textContent.trim())")
    assert "verdict" in headers and "discrimination" in headers
    verdicts = page.js("""Array.from(document.querySelectorAll('article table td'))
                          .map(td => td.textContent.trim()).filter(t => ['PASS', 'FAIL', 'INCONCLUSIVE'].includes(t))""")
    assert verdicts
    images = page.js("""Promise.all(Array.from(document.querySelectorAll('article img')).map(img =>
                          img.decode().then(() => [img.getAttribute('src'), img.naturalWidth, img.naturalHeight],
                                            () => [img.getAttribute('src'), 0, 0])))""")
    assert images and all(w > 0 and h > 0 for _, w, h in images), images
    page.js("""Array.from(document.querySelectorAll('article table')).find(t => Array.from(t.querySelectorAll('th'))
               .some(th => th.textContent.trim() === 'verdict')).scrollIntoView({block: 'center'})""")
    page.screenshot(SCREENSHOTS / f"method-{METHOD_PAGE}.png")
    page.js("document.querySelector('article img').scrollIntoView({block: 'center'})")
    page.screenshot(SCREENSHOTS / f"method-{METHOD_PAGE}-plot.png")
