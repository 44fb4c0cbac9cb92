"""A text progress bar for ffnlab.evolve, ffnlab.train and ffnlab.toy: stage lines, and one bar
redrawn in place (a terminal or a notebook's output), at most a few times a second."""
import sys
import time


def _clock(seconds):
    s = int(max(0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class TextProgress:
    """progress(kind, done, planned, text, eta_seconds), as the bindings call it."""

    def __init__(self, stream=None, width=30, every=0.25):
        """stream: where the bar and the lines go (None: sys.stdout); width: the bar's
        characters; every: the least seconds between two redraws of the bar."""
        self.stream = stream or sys.stdout
        self.width, self.every = width, every
        self._last = 0.0
        self._open = False

    def __call__(self, kind, done, planned, text, eta):
        if kind in ("begin", "message", "eval"):
            self._close()
            self.stream.write(f"{text}\n")
        elif kind == "step":
            now = time.monotonic()
            if now - self._last < self.every and done < planned:
                return
            self._last = now
            filled = int(self.width * done / planned) if planned else 0
            bar = "#" * filled + "." * (self.width - filled)
            eta_text = f" ETA {_clock(eta)}" if eta >= 0 else ""
            self.stream.write(f"\r[{bar}] {done}/{planned}{eta_text} {text}  ")
            self._open = True
        elif kind == "end":
            self._close()
        self.stream.flush()

    def close(self):
        """Ends an open bar's line (the work stopped before its "end": an error, Ctrl-C)."""
        self._close()
        self.stream.flush()

    def _close(self):
        if self._open:
            self.stream.write("\n")
            self._open = False
