"""The documentation a user reads: README.md short, with no commit hash outside its generated
results block; every relative link in README.md and docs/ leads to a file of the repository;
docs/README.md indexes every doc; and the repository cites papers and its own docs, never a
document it does not contain (SPEC and a section number)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from pipeline.publish import readme

ROOT = Path(__file__).resolve().parents[1]

#: The README's size limit (issue 36): what it is, two commands, the results, the CLI.
README_MAX_CHARS = 15_000

#: A commit id as git abbreviates it (7 hex digits) up to a full SHA-1 (40).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")

#: A Markdown link or image target: ``[text](target)``, ``![alt](target)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")

#: A citation of a specification the repository does not hold.
SPEC_CITATION = re.compile(r"\bSPEC(?:\s+\d+(?:\.\d+)*\b|\.md\b)")


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def commits_outside_block(text: str) -> list[str]:
    """The commit-like hex words of ``text`` outside its results block (if it has one)."""
    if readme.BEGIN in text:
        text = text.replace(readme.current_block(text), "")
    return COMMIT.findall(text)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative link targets of the Markdown file ``path`` that name no file or folder
    of the repository (anchors and web addresses are not checked)."""
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor of this page
        file = unquote(target.split("#", 1)[0])
        resolved = (path.parent / file).resolve()
        if not resolved.exists() or root.resolve() not in (resolved, *resolved.parents):
            broken.append(target)
    return broken


def unindexed(root: Path = ROOT) -> list[str]:
    """The docs under docs/ that docs/README.md does not link to."""
    index = root / "docs" / "README.md"
    linked = {
        (index.parent / unquote(t.split("#", 1)[0])).resolve()
        for t in LINK.findall(index.read_text(encoding="utf-8"))
    }
    return [
        str(p.relative_to(root))
        for p in sorted((root / "docs").rglob("*.md"))
        if p != index and p.resolve() not in linked
    ]


def spec_citations(root: Path = ROOT) -> list[str]:
    """``file:line`` of every SPEC citation in the tracked text files."""
    files = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, check=True
    ).stdout.split("\0")
    found = []
    for name in filter(None, files):
        path = root / name
        if not path.is_file() or path.suffix in {".png", ".pt", ".gz", ".zip", ".mat"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if SPEC_CITATION.search(line):
                found.append(f"{name}:{number}")
        # a citation broken across two lines ("SPEC\n1.3")
        for match in re.finditer(r"\bSPEC\s*\n\s*\d", text):
            found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}")
    return found


def test_readme_is_short():
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size <= README_MAX_CHARS, f"README.md: {size:,} characters, at most {README_MAX_CHARS:,}"


def test_readme_names_no_commit_outside_its_results_block():
    assert commits_outside_block((ROOT / "README.md").read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == [], f"{path.relative_to(ROOT)}: links to no file"


def test_the_docs_index_links_every_doc():
    assert unindexed() == [], "docs/README.md does not link these"


def test_no_spec_citation_in_the_repository():
    assert spec_citations() == [], "cite the paper or a doc of this repository instead"


def test_the_checks_can_fail(tmp_path):
    """Each check finds what it is for, in a small repository made to fail them."""
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    text = f"see 24f1861f2ca5 and [x](docs/none.md)\n{readme.BEGIN}\n`24f1861f2ca5`\n{readme.END}\n"
    (tmp_path / "README.md").write_text(text)
    (tmp_path / "docs" / "README.md").write_text("[a](guides/a.md)\n")
    (tmp_path / "docs" / "guides" / "a.md").write_text("[up](../../README.md) [b](b.md#x)\n")
    spec = "SPEC"  # spelt apart, so this file cites nothing
    (tmp_path / "docs" / "guides" / "b.md").write_text(f"as in {spec}\n1.3 and {spec} 2.2\n")
    assert commits_outside_block(text) == ["24f1861f2ca5"]
    assert commits_outside_block("1a2b3c4d is one; 1234567 a number; defaced a word") == [
        "1a2b3c4d"
    ]
    assert broken_links(tmp_path / "README.md", tmp_path) == ["docs/none.md"]
    assert broken_links(tmp_path / "docs" / "guides" / "a.md", tmp_path) == []
    assert unindexed(tmp_path) == ["docs/guides/b.md"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    assert spec_citations(tmp_path) == ["docs/guides/b.md:2", "docs/guides/b.md:1"]
    assert len(text) <= README_MAX_CHARS < len(text * 1000)
