"""docs/architecture.md names only files and directories that exist (it is read to find them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A path of the repository: at least one directory, then a file with an extension or a trailing slash.
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+(?:[\w.-]+\.(?:py|md|yaml|sh|toml|json)|))(?![\w/-])")


def test_every_path_the_architecture_page_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = {m.group(1) for m in PATH.finditer(text) if not m.group(1).startswith(("http", "../"))}
    assert named, "the pattern finds the page's paths"
    missing = sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / "docs" / p).exists())
    assert missing == []
