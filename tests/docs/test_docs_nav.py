"""Every page in docs/ is in the site's nav, and every nav entry is a page.

A page written but not in the nav is one no reader finds. The strict site
build catches it too (``validation.omitted_files``), but only where the docs
extra is installed; these are plain file checks: no TensorFlow, no MkDocs.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NAV_ENTRY = re.compile(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", re.MULTILINE)


def nav_pages() -> list[str]:
    config = (ROOT / "mkdocs.yml").read_text()
    return NAV_ENTRY.findall(config.split("\nnav:\n", 1)[1])


def test_every_docs_page_is_in_the_nav():
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    missing = sorted(pages - set(nav_pages()))
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_every_nav_entry_is_a_page_listed_once():
    pages = nav_pages()
    assert len(pages) >= 20, pages  # the nav was read, not an empty match
    assert len(pages) == len(set(pages)), sorted(pages)
    absent = [page for page in pages if not (DOCS / page).is_file()]
    assert not absent, f"mkdocs.yml's nav names missing pages: {absent}"
