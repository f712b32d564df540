"""The project's documentation as the tests read it: README.md and every page of docs/ (the
site's Markdown), so that a table or a block a test checks stays checked wherever it lives."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documentation_pages() -> list[Path]:
    """README.md, then docs/ in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def documentation_text() -> str:
    return "\n".join(page.read_text() for page in documentation_pages())
