"""Every relative link in the project's hand-written pages (the README, docs/, the calibration,
benchmark and test-data READMEs) reaches a file of the project, and every `#anchor` a heading
or an `<a id>` of the page it names: a section moved or renamed fails here, not in a reader's
browser. The reports under results/ are written by zerosim and left out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "scenarios" / "calibration" / "README.md", ROOT / "benchmarks" / "README.md",
         ROOT / "benchmarks" / "node_probe" / "README.md",
         ROOT / "tests" / "data" / "real_configs" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def heading_anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    found = {heading_anchor(line.lstrip("#")) for line in text.splitlines()
             if line.startswith("#")}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def links(page: Path) -> list[str]:
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text)
            if not target.startswith(("http://", "https://", "mailto:"))]


def test_the_anchor_of_a_heading_is_githubs():
    assert heading_anchor("The loop outside DeepSpeed's timers") == (
        "the-loop-outside-deepspeeds-timers")
    assert heading_anchor("Seeing it: plots, traces, notebooks") == (
        "seeing-it-plots-traces-notebooks")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_anchor(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading or <a id> '{anchor}' in {linked.name}")
    assert not broken, "\n".join(broken)
