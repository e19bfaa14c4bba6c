"""A small structured document rendered both to Markdown and to self-contained HTML."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathlift.files import read_regular, write_text


def _md_row(cells: Sequence[str]) -> str:
    """A Markdown table row; pipes inside cells (as in ||Phi||_1) are escaped."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


@dataclass
class Document:
    """Headings, paragraphs, tables and PNG figures, in order. Figures are files in the
    output folder; Markdown references them, HTML embeds them in base64."""

    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(("heading", text))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.blocks.append(("table", (list(header), [[str(c) for c in r] for r in rows])))

    def figure(self, path: Path, caption: str) -> None:
        self.blocks.append(("figure", (path, caption)))

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                out += [f"## {value}", ""]
            elif kind == "para":
                out += [str(value), ""]
            elif kind == "table":
                header, rows = value
                out.append(_md_row(header))
                out.append("|:---|" + "---:|" * (len(header) - 1))  # labels left, values right
                out += [_md_row(r) for r in rows]
                out.append("")
            else:
                path, caption = value
                out += [f"![{caption}]({path.name})", "", f"*{caption}*", ""]
        return "\n".join(out)

    def to_html(self) -> str:
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                body.append(f"<h2>{html.escape(str(value))}</h2>")
            elif kind == "para":
                body.append(f"<p>{html.escape(str(value))}</p>")
            elif kind == "table":
                header, rows = value
                head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r)
                                + "</tr>" for r in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
            else:
                path, caption = value
                data = base64.b64encode(read_regular(path)).decode("ascii")
                body.append(f'<figure><img src="data:image/png;base64,{data}" '
                            f'alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}'
                            "</figcaption></figure>")
        style = ("body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}"
                 "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;"
                 "padding:.25em .6em;text-align:right}td:first-child,th:first-child"
                 "{text-align:left}img{max-width:100%}"
                 "figcaption{font-style:italic;color:#444}")
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(self.title)}</title><style>{style}</style></head><body>"
                + "\n".join(body) + "</body></html>\n")

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        """Write report.md and report.html into ``out_dir``; returns their paths."""
        return (write_text(out_dir / "report.md", self.to_markdown()),
                write_text(out_dir / "report.html", self.to_html()))
