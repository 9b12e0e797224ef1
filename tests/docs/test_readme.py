"""The README is the short front page: the two commands, and links that resolve.

The user guide lives in docs/ (the site); the README keeps what and why, the
install, the two commands CI runs, an example, the feature table and links.
Plain file checks: no TensorFlow, no MkDocs.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_the_readme_is_a_front_page_under_250_lines():
    assert len(README.splitlines()) < 250


def test_the_readme_names_the_two_commands_ci_runs():
    assert "make demo " in README and "make test " in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_of_the_readme_resolves():
    targets = [m.group(1) for m in LINK.finditer(README) if "://" not in m.group(1)]
    assert len(targets) >= 15, targets  # the feature table and the documentation list
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_every_docs_page_the_readme_links_is_in_the_site_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {m.group(1).removeprefix("docs/") for m in LINK.finditer(README)
             if m.group(1).startswith("docs/") and m.group(1).endswith(".md")}
    assert pages and all(f": {page}" in nav for page in pages), sorted(pages)


def slug(heading: str) -> str:
    """The anchor MkDocs's toc gives a heading (its default slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text)


def test_every_anchor_the_readme_links_is_a_heading_of_its_page():
    links = [(m.group(1), m.group(2)[1:]) for m in LINK.finditer(README)
             if m.group(2) and m.group(1).endswith(".md")]
    assert links, "the README links no section of a page"
    broken = []
    for target, anchor in links:
        headings = re.findall(r"^#+ (.+)$", (ROOT / target).read_text(), re.MULTILINE)
        if anchor not in {slug(heading) for heading in headings}:
            broken.append(f"{target}#{anchor}")
    assert not broken, f"README links to missing sections: {broken}"
