"""The live progress bar of the library's long loops (training steps, tokenizing documents): a rich bar on stderr
while stderr is a terminal, nothing otherwise.

Off a terminal (a batch job's log, a pipe) a redrawn bar leaves unreadable frames, so there the callers write plain
lines of their own (the trainer a log line per logged step, data preparation a line about every 10%).
"""
from __future__ import annotations

import sys


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (False for a replaced or closed stream)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


class Bar:
    """``Bar(total, description, unit, initial=0, live=None)``: a transient bar of ``total`` ``unit``s (None:
    unknown) starting at ``initial``, shown only when ``live`` (default: stderr is a terminal); ``update(n)``,
    ``set_postfix(**fields)`` (shown after the bar, e.g. the loss) and ``close()`` do nothing when it is not."""

    def __init__(self, total: int | None, description: str, unit: str, initial: int = 0, live: bool | None = None):
        self._progress = None
        if not (stderr_is_terminal() if live is None else live):
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn(unit), TimeElapsedColumn(), TextColumn("{task.fields[postfix]}"),
                                  console=Console(stderr=True), transient=True)
        self._task = self._progress.add_task(description, total=total, completed=initial, postfix="")
        self._progress.start()

    def update(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_postfix(self, **fields) -> None:
        if self._progress is not None:
            self._progress.update(self._task, postfix="  ".join(f"{k} {v}" for k, v in fields.items()))

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
