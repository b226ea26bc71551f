"""A build hook for the site's tables, so that they read on a phone's 360 px column.

- Each body cell gets its column's heading as ``data-label``: on a phone the stylesheet
  (docs/stylesheets/extra.css) shows each row as a card of labelled lines instead of
  columns squeezed to a few letters each.
- Code in a cell wraps only where a reader would. A browser wraps inline code anywhere
  once a cell is narrow (``devrng.fork_r`` / ``ng(devices=[x])``), or nowhere with
  ``white-space: nowrap``. Here the code is cut after each ``.``, ``(``, ``,``, ``=`` and
  ``/`` and at its spaces; each piece is kept whole (``<span class="nobr">``) and a ``<wbr>``
  (a break that copies as nothing) joins the pieces.
"""

from __future__ import annotations

import html
import re
from typing import Any

_TABLE = re.compile(r"<table>(.*?)</table>", flags=re.S)
_HEADING = re.compile(r"<th[^>]*>(.*?)</th>", flags=re.S)
_CELL = re.compile(r"(<t[dh][^>]*>)(.*?)(</t[dh]>)", flags=re.S)
_CODE = re.compile(r"(<code[^>]*>)(.*?)(</code>)", flags=re.S)
_TAG = re.compile(r"(<[^>]+>)")
_POINT = re.compile(r"(?<=[.(,=/])(?![.)\],])")  # after these, unless more punctuation follows


def breakable(code: str) -> str:
    """``fork_rng(devices=[x])`` -> the pieces ``fork_rng(`` ``devices=`` ``[x])``, each
    kept whole, joined by ``<wbr>``."""
    out = []
    for part in _TAG.split(code):
        if part.startswith("<"):
            out.append(part)
            continue
        # Only text between tags changes; entities (&lt;) hold none of the four characters.
        for word in re.split(r"(\s+)", part):
            if not word or word.isspace():
                out.append(word)
            else:
                out.append("<wbr>".join(f'<span class="nobr">{piece}</span>'
                                        for piece in _POINT.split(word) if piece))
    return "".join(out)


def labelled(table: str) -> str:
    """``<table>`` markup with each body cell labelled by its column's heading."""
    head, found, body = table.partition("</thead>")
    labels = [html.escape(html.unescape(_TAG.sub("", h)).strip(), quote=True)
              for h in _HEADING.findall(head)]
    rows = []
    for row in re.split(r"(?=<tr>)", body):
        first, *cells = re.split(r"<td(?=[ >])", row)
        named = [*labels, *[""] * len(cells)][:len(cells)]  # a row longer than its heading
        rows.append(first + "".join(f'<td data-label="{label}"' + cell
                                    for label, cell in zip(named, cells, strict=True)))
    return head + found + "".join(rows)


def _cell(match: re.Match[str]) -> str:
    return match[1] + _CODE.sub(lambda m: m[1] + breakable(m[2]) + m[3], match[2]) + match[3]


def on_page_content(content: str, **kwargs: Any) -> str:
    content = _TABLE.sub(lambda m: "<table>" + labelled(m[1]) + "</table>", content)
    return _CELL.sub(_cell, content)
