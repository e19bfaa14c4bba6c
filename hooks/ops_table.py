"""mkdocs hook: the docs' table of supported operations is generated from the op table's
registry (``pathlift.graph.ops.base.supported_table``), never kept by hand. A page writes
``<!-- ops: table -->`` on a line of its own where the table goes (docs/networks.md)."""

from __future__ import annotations

from typing import Any

from pathlift.graph.ops.base import supported_table

MARKER = "<!-- ops: table -->"


def expand(markdown: str) -> str:
    """``markdown`` with every marker line replaced by the generated table."""
    return "\n".join(supported_table() if line.strip() == MARKER else line
                     for line in markdown.split("\n"))


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)
