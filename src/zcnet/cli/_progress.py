"""Progress of a run of cells (a leading underscore: not a subcommand itself).

On a terminal: a bar with the cell being measured, cells done of the total, time elapsed and an
estimate of the time left. Anywhere else (a log file, CI): no bar, whose redraws would fill
the log, but one line per finished cell with the same totals and estimate.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class CellProgress:
    """``with CellProgress(console, total, name) as p``: ``p.start(text)`` as a cell begins,
    ``p.done(text, result)`` when it ends. ``console`` is where progress goes (stderr)."""

    def __init__(self, console: Console, total: int, name: str) -> None:
        self.console = console
        self.total = total
        self.name = name
        self.count = 0
        self.t0 = time.monotonic()
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("{task.description}", markup=False), BarColumn(bar_width=20),
                MofNCompleteColumn(), TextColumn("cells"), TimeElapsedColumn(),
                TextColumn("left"), TimeRemainingColumn(), console=console, transient=True)

    def __enter__(self) -> CellProgress:
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task(self.name, total=self.total)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Remove the bar (before the tables print); idempotent."""
        if self.bar is not None:
            self.bar.stop()

    def start(self, text: str) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, description=f"{self.name}: {text}")

    def eta(self) -> float | None:
        """Seconds left at the mean pace so far; None before the first cell ends."""
        if not self.count:
            return None
        return (time.monotonic() - self.t0) / self.count * (self.total - self.count)

    def done(self, text: str, result: str) -> None:
        self.count += 1
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=1)
            return
        left = self.eta()
        line = (f"[{self.count}/{self.total}] {self.name}: {text}: {result} (elapsed "
                f"{_clock(time.monotonic() - self.t0)}"
                + (f", about {_clock(left)} left)" if left is not None and self.count < self.total
                   else ")"))
        self.console.print(Text(line), soft_wrap=True)
