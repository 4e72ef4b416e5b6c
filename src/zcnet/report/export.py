"""Render ``Table``s: rich for the terminal, Markdown and CSV for files.

Library code returns strings or writes files; only the CLI hands a console in.
"""

from __future__ import annotations

import csv
import io
import os
import textwrap
from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table as RichTable
from rich.text import Text

from zcnet.bench.meta import write_text_atomic
from zcnet.bench.records import ResultRow
from zcnet.errors import ZcnetError
from zcnet.report.tables import Table, flat_rows


def to_rich(table: Table) -> RichTable:
    """Every header and cell as literal ``Text``: results carry user text (spec titles,
    reasons, host names) in which ``[`` is a character, not rich markup. The title is printed
    above the table (``print_tables``): a rich title wraps at the table's own width."""
    rt = (RichTable(title=None, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
          if table.compact else RichTable(title=None))
    for i, h in enumerate(table.headers):
        # Numbers right-aligned; the first column (labels) and a verdict column read left.
        left = i == 0 or h in ("verdict", "vs baseline")
        rt.add_column(Text(h), justify="left" if left else "right", no_wrap=i == 0,
                      overflow="fold")
    for row in table.rows:
        rt.add_row(*(Text(str(c)) for c in row))
    return rt


def fits(console: Console, renderable: RichTable) -> bool:
    """Whether ``renderable`` fits the console's width without squeezing a column: its
    natural width, measured as if the console had room for any width."""
    wide = console.options.update_width(1 << 16)
    return Measurement.get(console, wide, renderable).maximum <= console.width


def make_console(*, stderr: bool = False) -> Console:
    """A console for the CLI. Piped into a file, rich would assume 80 columns and cut cells; a
    report is worth more whole, so off a terminal the width is generous. Markup is off: what
    the CLI prints (spec titles, file names, error text, hints) is shown literally."""
    probe = Console(stderr=stderr, markup=False)
    return probe if probe.is_terminal else Console(stderr=stderr, width=160, markup=False)


def note_style(note: str) -> str:
    return "yellow" if note.startswith(("warning", "substituted", "incomplete")) else "dim"


def print_notes(console: Console, notes: Iterable[str]) -> None:
    """Notes indented under a table; a long one wraps under itself, not under the margin."""
    for note in notes:
        lines = textwrap.wrap(note, max(20, console.width - 2), subsequent_indent="  ",
                              break_long_words=False, break_on_hyphens=False) or [""]
        for line in lines:
            console.print(Text(f"  {line}", style=note_style(note)), soft_wrap=True)


def print_tables(console: Console, tables: Iterable[Table]) -> None:
    for t in tables:
        if t.title:
            console.print(Text(t.title, style="bold"))
        if t.headers:
            console.print(to_rich(t))
        print_notes(console, t.notes)


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


def to_csv(results: list[ResultRow]) -> str:
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
