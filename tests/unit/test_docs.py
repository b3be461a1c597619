"""The documentation a reader browses: README fits on a few screens, and every relative
link in it and in docs/ leads to a file that exists (a heading anchor to a heading)."""

import re

import pytest

from tests.utils import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if line.startswith("#")}


def test_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 320


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: {target}"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file.read_text()), f"{page.name}: {target}"


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_the_backends_a_device_takes_are_the_runtimes_bitdrift_has(page):
    """The `backend:` comment of a page's device example lists bitdrift.runtimes.RUNTIMES,
    the list the config schema's enum is checked against: none left out, none made up."""
    from bitdrift.runtimes import RUNTIMES

    listed = re.findall(r"^\s+backend: \w+ +# (.+)$", (ROOT / page).read_text(), re.M)
    assert listed, f"{page}: no commented `backend:` line"
    for comment in listed:
        assert [name.strip() for name in comment.split("|")] == list(RUNTIMES), page
