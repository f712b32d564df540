"""The documentation site (docs/, mkdocs.yml): it builds with `mkdocs build --strict`, so every
page is in the navigation and every link and anchor resolves; the README stays a front page."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

from tests.support.docs import ROOT, documentation_pages

README_LINES = 250


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "index.html").is_file()
    # the quick start is the README's, included, not a copy
    cluster = (tmp_path / "getting-started" / "cluster" / "index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", cluster))  # code is split into highlight spans
    assert "helm install stunner charts/stunner -n stunner-system --create-namespace" in text


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < README_LINES
    assert readme.startswith("# STUNner (Python)\n\n```sh\nbash hack/demo.sh")
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    pages = {str(p.relative_to(ROOT)) for p in documentation_pages()[1:]}
    assert linked and linked <= pages
    missing = pages - linked - {"docs/index.md"}  # the front page: linked, not required
    assert not missing, f"docs pages the README does not link: {sorted(missing)}"
