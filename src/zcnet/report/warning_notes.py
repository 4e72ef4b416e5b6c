"""The warnings of result rows as notes under a table: once per cell, not once per repeat.

A row carries ``warnings`` (a list of texts) and, for a flow, ``interval_cv``: the spread of its
per-interval rate. A cell run five
times on a busy machine would repeat the same texts five times; here each distinct text shows
once, and the spread reads as how many repeats wandered and by how much at most.
"""

from __future__ import annotations

from collections.abc import Iterable

from zcnet.bench.intervals import UNSTABLE_CV, UNSTEADY
from zcnet.bench.records import ResultRow


def cell_warnings(label: str, rows: list[ResultRow]) -> list[str]:
    """``warning: LABEL: text`` for each distinct warning of one cell's rows; the rate's spread
    summarized over the repeats."""
    texts = dict.fromkeys(w for r in rows for w in r.warnings if not w.startswith(UNSTEADY))
    out = [f"warning: {label}: {t}" for t in texts]
    cvs = [r.interval_cv for r in rows if r.interval_cv is not None]
    wandered = [cv for cv in cvs if cv > UNSTABLE_CV]
    if wandered:
        which = f" in {len(wandered)} of {len(cvs)} repeats" if len(cvs) > 1 else ""
        most = "up to " if len(wandered) > 1 else ""
        out.append(f"warning: {label}: {UNSTEADY}{which}: the per-interval rate varied "
                   f"{most}{100 * max(wandered):.0f}% (stdev/mean, limit "
                   f"{100 * UNSTABLE_CV:.0f}%)")
    elif not cvs:
        # A file from before intervals were sampled: its own text, if it had one.
        out += [f"warning: {label}: {w}" for r in rows for w in r.warnings
                if w.startswith(UNSTEADY)][:1]
    return out


def notes_for(cells: Iterable[tuple[str, list[ResultRow]]]) -> list[str]:
    """The warnings of every (label, rows) cell, in order."""
    return [n for label, rows in cells for n in cell_warnings(label, rows)]
