"""Render ``Table``s: rich for the terminal, Markdown and CSV for files.

Library code returns strings or writes files; only the CLI hands a console in.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from zcnet.bench.meta import write_text_atomic
from zcnet.errors import ZcnetError
from zcnet.report.tables import Table, flat_rows


def to_rich(table: Table) -> RichTable:
    """Every title, header and cell as literal ``Text``: results carry user text (spec titles,
    reasons, host names) in which ``[`` is a character, not rich markup."""
    rt = RichTable(title=Text(table.title), title_justify="left")
    for i, h in enumerate(table.headers):
        # Numbers right-aligned; the first column (labels) and a verdict column read left.
        left = i == 0 or h in ("verdict", "vs baseline")
        rt.add_column(Text(h), justify="left" if left else "right", no_wrap=i == 0,
                      overflow="fold")
    for row in table.rows:
        rt.add_row(*(Text(str(c)) for c in row))
    return rt


def make_console(*, stderr: bool = False) -> Console:
    """A console for the CLI. Piped into a file, rich would assume 80 columns and cut cells; a
    report is worth more whole, so off a terminal the width is generous. Markup is off: what
    the CLI prints (spec titles, file names, error text, hints) is shown literally."""
    probe = Console(stderr=stderr, markup=False)
    return probe if probe.is_terminal else Console(stderr=stderr, width=160, markup=False)


def note_style(note: str) -> str:
    return "yellow" if note.startswith(("warning", "substituted", "incomplete")) else "dim"


def print_tables(console: Console, tables: Iterable[Table]) -> None:
    for t in tables:
        console.print(to_rich(t))
        for note in t.notes:
            console.print(Text(f"  {note}", style=note_style(note)))


def say(console: Console, text: str, style: str = "") -> None:
    """Print one line of text literally (no markup, no highlighting)."""
    console.print(Text(text, style=style))


def to_text(tables: Iterable[Table], width: int = 120) -> str:
    """The terminal rendering without colour, e.g. for a report file or a test."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      legacy_windows=False, markup=False)
    print_tables(console, tables)
    return buf.getvalue()


def _md_escape(cell: str) -> str:
    """A cell on one line: a newline from user text would end the table row."""
    return " ".join(str(cell).replace("|", "\\|").splitlines())


def to_markdown(tables: Iterable[Table]) -> str:
    parts = []
    for t in tables:
        lines = [f"### {_md_escape(t.title)}", "",
                 "| " + " | ".join(map(_md_escape, t.headers)) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(t.headers))) + "|"]
        lines += ["| " + " | ".join(map(_md_escape, r)) + " |" for r in t.rows]
        if t.notes:
            lines.append("")
            lines += [f"- {' '.join(n.splitlines())}" for n in t.notes]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_csv(results: list[dict[str, Any]]) -> str:
    headers, rows = flat_rows(results)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    w.writerows(rows)
    return buf.getvalue()


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Atomic like meta.write_json: a reader never sees half a report. A path that cannot be
    written is a ``ZcnetError`` naming it, and the temporary file is not left behind."""
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise unwritable(path, exc) from None


def unwritable(path: str | os.PathLike[str], exc: OSError) -> ZcnetError:
    """The error for an output file or directory the user named that cannot be written."""
    return ZcnetError(f"cannot write {path}: {exc.strerror or exc}",
                      "give a path in an existing, writable directory")
