"""The docs hold together: every relative link in README.md and docs/*.md resolves inside the
repository, the README's options table lists every option, and the packaging files exist and agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vfuse
from vfuse.context import option_names

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "src/vfuse/frontend/README.md"]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    for target in relative_links(path):
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name} links {target}, outside the repository"
        assert resolved.exists(), f"{path.name} links {target}, which does not exist"


def test_the_link_check_finds_links() -> None:
    assert "docs/architecture.md" in relative_links(ROOT / "README.md")
    assert not any(t.startswith("http") for t in relative_links(ROOT / "README.md"))


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_options_table_lists_every_option() -> None:
    table = section((ROOT / "README.md").read_text(encoding="utf-8"), "Options")
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert rows == list(option_names())


def test_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines[2] == "```sh" and lines[3].startswith("make demo ") and lines[4].startswith("make test ")


def test_readme_has_the_sections_a_newcomer_needs() -> None:
    headings = re.findall(r"^## (\w+)", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.M)
    for name in ("Install", "Quick", "Options", "API", "Logging", "Troubleshooting", "Measured"):
        assert name in headings


def test_packaging_files_agree() -> None:
    tomllib = pytest.importorskip("tomllib")  # standard library from Python 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == vfuse.__version__
    assert project["license"] == "Apache-2.0" and "Apache License" in (ROOT / "LICENSE").read_text()
    assert "torch>=2.13,<2.14" in project["dependencies"]
    assert (ROOT / "src/vfuse/py.typed").is_file()
    assert f"## {vfuse.__version__}" in (ROOT / "CHANGELOG.md").read_text()
