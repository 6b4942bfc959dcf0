"""Wall time per named step of a run, for its report and its log line: :class:`StepClock`.

The expectations run sums seconds per step (``step_seconds`` of its report); the speed layer keeps whole
milliseconds per step of a micro-batch (``writer_ms`` of its progress record).
"""

from __future__ import annotations

import time


class StepClock:
    """Wall time per named step, into ``into`` (a report's dict) when given: seconds rounded to the
    millisecond, or whole milliseconds (truncated) with ``millis``; a step that repeats adds up.
    :meth:`lap` ends a step: the time since the clock started or since the previous lap."""

    def __init__(self, into: dict | None = None, *, millis: bool = False) -> None:
        self.durations = into if into is not None else {}
        self.millis = millis
        self._since = time.monotonic()

    def lap(self, step: str) -> None:
        now = time.monotonic()
        if self.millis:
            self.durations[step] = self.durations.get(step, 0) + int((now - self._since) * 1000)
        else:
            self.durations[step] = round(self.durations.get(step, 0.0) + now - self._since, 3)
        self._since = now

    def __str__(self) -> str:
        if self.millis:
            return ", ".join(f"{step} {ms} ms" for step, ms in self.durations.items())
        return ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.durations.items())
