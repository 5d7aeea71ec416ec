"""Progress of long work on stderr: a live bar on a terminal; in a log or a pipe, a plain line every tenth of the way.

A bar redraws itself with carriage returns, which a log file keeps as hundreds of overwritten updates; off a
terminal the same calls print whole lines instead (about eleven for the whole run, the last at the end).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class LogProgress:
    """tqdm's `update` / `set_postfix_str` / `close` as plain lines: `eval 12/120 ep (10%) 34 s  <postfix>`."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file or sys.stderr
        self.n = 0
        self.postfix = ""
        self.started = time.monotonic()
        self._printed_at = 0  # the count of the last line printed

    def update(self, n: int = 1) -> None:
        """Count `n` more done; print a line when another tenth of the total (or all of it) is done."""
        self.n += n
        step = max(1, self.total // 10)
        if self.n >= self._printed_at + step or self.n == self.total:
            self._line()

    def set_postfix_str(self, text: str) -> None:
        """What the next line ends with (the latest episode's result)."""
        self.postfix = text

    def close(self) -> None:
        """A last line when the work stopped between two printed ones (an interrupted run)."""
        if self.n != self._printed_at:
            self._line()

    def _line(self) -> None:
        self._printed_at = self.n
        share = f" ({100 * self.n // self.total}%)" if self.total else ""
        elapsed = time.monotonic() - self.started
        tail = f"  {self.postfix}" if self.postfix else ""
        print(f"{self.desc} {self.n}/{self.total} {self.unit}{share} {elapsed:.0f} s{tail}", file=self.file, flush=True)


def progress_bar(total: int, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr when it is a terminal, else a `LogProgress` with the same methods."""
    if not sys.stderr.isatty():
        return LogProgress(total, desc, unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
