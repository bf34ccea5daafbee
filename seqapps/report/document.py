"""The blocks of a report and the one HTML page they make: no script, no stylesheet or image fetched.

A pipeline's ``report_sections`` returns ``Section``s of ``Text``, ``Table`` and ``Figure``
blocks; ``render_html`` writes them into one page, each figure as an inline PNG (``data:`` URI),
so the file opens anywhere without a network.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import re
from typing import Any, Sequence, Union

#: a report over this size has its figures dropped, largest first, with a note in their place
MAX_REPORT_BYTES = 10 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Text:
    """A paragraph (plain text; ``preformatted`` keeps line breaks and spacing, for samples and configs)."""

    text: str
    preformatted: bool = False


@dataclasses.dataclass(frozen=True)
class Table:
    """A table: a header row and rows of cells (numbers are shown to 4 significant digits).

    Attributes:
        columns: the header cells.
        rows: the rows, each as long as ``columns``.
        caption: a line under the table.
    """

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    caption: str = ""


@dataclasses.dataclass(frozen=True)
class Figure:
    """One picture: a PNG and what it shows.

    Attributes:
        name: a short identifier, unique in the report (the TensorBoard image tag).
        png: the encoded PNG (``seqapps.report.plots`` draws them).
        caption: what it shows, under the picture.
    """

    name: str
    png: bytes
    caption: str = ""


Block = Union[Text, Table, Figure]


@dataclasses.dataclass(frozen=True)
class Section:
    """A titled part of the report.

    Attributes:
        title: the heading.
        blocks: its content, in order.
        anchor: the HTML id (default: the title in lower case, words joined by ``-``); tests look
            sections up by it.
    """

    title: str
    blocks: Sequence[Block]
    anchor: str = ""

    def id(self) -> str:
        """The section's HTML id."""
        return self.anchor or re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def figures_of(sections: Sequence[Section]) -> list[Figure]:
    """Every figure of the sections, in order."""
    return [block for section in sections for block in section.blocks if isinstance(block, Figure)]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _alignment(value: Any) -> str:
    """Numbers right-aligned (their digits line up), text left-aligned."""
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else "text"


def _block_html(block: Block) -> str:
    if isinstance(block, Text):
        return f"<pre>{html.escape(block.text)}</pre>" if block.preformatted else f"<p>{html.escape(block.text)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in block.columns)
        body = "".join("<tr>" + "".join(f'<td class="{_alignment(c)}">{html.escape(_cell(c))}</td>' for c in row)
                       + "</tr>" for row in block.rows)
        caption = f"<caption>{html.escape(block.caption)}</caption>" if block.caption else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    source = "data:image/png;base64," + base64.b64encode(block.png).decode("ascii")
    caption = f"<figcaption>{html.escape(block.caption)}</figcaption>" if block.caption else ""
    return (f'<figure id="figure-{html.escape(block.name)}"><img src="{source}" '
            f'alt="{html.escape(block.caption or block.name)}">{caption}</figure>')


_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .8em 0; } caption { caption-side: bottom; color: #555; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
td.number { text-align: right; white-space: nowrap; }
figure { margin: 1em 0; } img { max-width: 100%; } figcaption { color: #555; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
nav a { margin-right: 1em; }
"""


def render_html(title: str, sections: Sequence[Section], max_bytes: int = MAX_REPORT_BYTES) -> str:
    """The report as one self-contained HTML page.

    Args:
        title: the page's title and heading.
        sections: the sections in order; a contents line links each.
        max_bytes: the size bound: while the page is larger, the largest figure is replaced by a
            note saying so.

    Returns:
        The HTML text (UTF-8 when written).
    """
    sections = list(sections)
    while True:
        nav = " ".join(f'<a href="#{s.id()}">{html.escape(s.title)}</a>' for s in sections)
        parts = [f'<section id="{s.id()}"><h2>{html.escape(s.title)}</h2>'
                 + "".join(_block_html(b) for b in s.blocks) + "</section>" for s in sections]
        page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
                f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1><nav>{nav}</nav>"
                + "".join(parts) + "</body></html>\n")
        figures = figures_of(sections)
        if len(page.encode("utf-8")) <= max_bytes or not figures:
            return page
        largest = max(figures, key=lambda figure: len(figure.png))
        note = Text(f"(figure {largest.name!r} left out: the report is kept under {max_bytes / 2**20:.3g} MB)")
        sections = [dataclasses.replace(s, blocks=[note if b is largest else b for b in s.blocks]) for s in sections]
