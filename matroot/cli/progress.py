"""Progress of long tool runs: a tqdm bar on a terminal, plain timestamped lines in a log."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

__all__ = ["Progress"]


class Progress:
    """Counts steps of a long run and shows them on ``stream`` (stderr by default).

    ``done`` and ``started`` continue a count begun elsewhere (a parent process).

    Examples
    --------
    >>> import io
    >>> from matroot.cli.progress import Progress
    >>> log = io.StringIO()
    >>> progress = Progress(2, stream=log)
    >>> progress.step("numpy evd")
    >>> log.getvalue().split()[0], log.getvalue().split()[-1]
    ('[1/2]', 'evd')
    """

    def __init__(self, total: int, *, done: int = 0, started: float | None = None,
                 stream=None):
        self.total = total
        self.done = done
        self.started = time.time() if started is None else started
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.bar = tqdm(total=total, initial=done, file=self.stream, dynamic_ncols=True,
                        leave=False) if isatty is not None and isatty() else None

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label[:60], refresh=False)
            self.bar.update(1)
            return
        elapsed = time.time() - self.started
        print(f"[{self.done}/{self.total}] {elapsed:6.1f}s  {label}", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
