"""What a long job shows while it works, on any stream: a progress bar where one is drawn (Execution.shows_progress:
asked for, or stderr is a terminal), and otherwise, unless the caller turned progress off (progress=False), a plain
line on stderr every LINE_EVERY seconds with the share done, the time so far and an estimate of the time left, so
that a job writing to a log file or a captured stream says it is working. A job shorter than LINE_EVERY prints
nothing; one that printed a line says when it is done.

    with meter(execution.progress, total=1200, desc="patching", unit="row") as bar:
        bar.update(16)
        bar.set_postfix({"loss": 0.31})        # shown on the bar, or at the end of the next line
"""

import sys
import time

from tqdm.auto import tqdm

LINE_EVERY = 30.0  # seconds between two lines where no bar is drawn


def shows(progress: bool | None) -> bool:
    """Whether a bar is drawn for the setting `progress` (Execution.progress): as asked, or, for None, when stderr
    is a terminal."""
    if progress is not None:
        return progress
    stream = sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


def meter(progress: bool | None, total: int | float, desc: str, unit: str = "it", initial: int | float = 0,
          unit_scale: bool = False, leave: bool = True):
    """A tqdm bar where the setting `progress` (Execution.progress) draws one, else Lines (or nothing at all with
    progress=False)."""
    if shows(progress) or progress is False:
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave,
                    disable=not shows(progress))
    return Lines(total, desc, unit, initial)


class Lines:
    """tqdm's update / set_postfix / close, as a line on stderr every LINE_EVERY seconds (see the module docstring)."""

    def __init__(self, total: int | float, desc: str, unit: str, initial: int | float = 0):
        self.total, self.desc = total, desc
        self.unit = unit if unit.endswith("s") else f"{unit}s"  # "12/40 rows", where a bar says "row/s"
        self.n = self.start_n = initial
        self.start = self.last = time.monotonic()
        self.postfix = ""
        self.printed = False

    def update(self, n: int | float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= LINE_EVERY:
            self.last = now
            self._line(self._status(now))

    def set_postfix(self, values: dict | None = None, **more) -> None:
        items = {**(values or {}), **more}
        self.postfix = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if self.printed:
            self._line(f"done, {self.n:,.0f} {self.unit} in {_duration(time.monotonic() - self.start)}")

    def __enter__(self) -> "Lines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _status(self, now: float) -> str:
        elapsed, done = now - self.start, self.n - self.start_n
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        left = ""
        if self.total and done > 0 and self.n < self.total:
            left = f", about {_duration(elapsed * (self.total - self.n) / done)} left"
        status = f"{self.n:,.0f}/{self.total:,.0f} {self.unit}{share}, {_duration(elapsed)} so far{left}"
        return status + (f"; {self.postfix}" if self.postfix else "")

    def _line(self, text: str) -> None:
        self.printed = True
        print(f"{self.desc}: {text}", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"
