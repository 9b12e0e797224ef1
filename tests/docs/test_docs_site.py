"""The documentation site builds with ``mkdocs build --strict``, with its generated pages.

Strict mode turns every warning into a failure: a broken link, a page missing
from the nav, an API reference (``::: hybridpar...``) naming nothing. The
configuration reference, the CLI page and the fixes table are generated at build time
(``docs/hooks.py``), so the test also checks that they hold every config key,
each command's flags and every known fix.
"""

import html
import pathlib
import re
import subprocess
import sys

import pytest

from hybridpar.config.reference import reference_rows

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytestmark = pytest.mark.docs
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def page_text(site: pathlib.Path, page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text()))


def test_the_configuration_page_lists_every_key(site):
    text = page_text(site, "configuration")
    missing = [row.key for row in reference_rows() if row.key not in text]
    assert not missing, f"keys missing from the configuration page: {missing}"


def test_the_cli_page_holds_each_commands_help(site):
    text = page_text(site, "cli")
    for flag in ("--config", "--logical_cpus", "--workers", "--max-restarts", "--index", "--to"):
        assert flag in text


def test_the_fixes_page_explains_every_known_fix_in_prose():
    from hybridpar import compat

    details = (ROOT / "docs" / "fixes.md").read_text().split("\n## What each fix does\n", 1)[1]
    missing = [fix.name for fix in compat.known() if f"`{fix.name}`" not in details]
    assert not missing, f"fixes with no paragraph in docs/fixes.md: {missing}"


def test_the_api_reference_renders_the_public_names(site):
    text = (site / "reference" / "hybridpar" / "index.html").read_text()
    for name in ("hybridpar.hybrid.scope", "hybridpar.hybrid.HybridStrategy",
                 "hybridpar.config.StrategyConfig", "hybridpar.startup.initialize"):
        assert f'id="{name}"' in text
    assert not (site / "hooks.py").exists()


def test_the_fixes_page_lists_every_registered_fix(site):
    from hybridpar import compat

    page = (site / "fixes" / "index.html").read_text()
    names = [fix.name for fix in compat.known()]
    assert len(names) >= 30
    missing = [name for name in names if f"<td><code>{name}</code></td>" not in page]
    assert not missing, f"fixes missing from the fixes page's table: {missing}"
