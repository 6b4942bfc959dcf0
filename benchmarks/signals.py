"""Signals for the benchmarks' command lines: a run stopped with SIGTERM (``kill``, a CI timeout) or SIGHUP (a
closed terminal) unwinds like Ctrl-C, so the ``finally`` that stops what it started (the Kafka broker, InfluxDB,
Spark, Airflow) runs. Without it those signals end the process at once and leave its stack running."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_stop_signals() -> None:
    """Make the first SIGINT, SIGTERM or SIGHUP raise :class:`KeyboardInterrupt` (naming the signal) in the main
    thread; later ones are ignored, so a second Ctrl-C cannot cut the run's shutdown short. For ``__main__``
    blocks only: the handlers are process-wide."""

    def interrupt(signum: int, _frame: object) -> None:
        ignore_stop_signals()
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)


def ignore_stop_signals() -> None:
    """From now on the stop signals do nothing (a shutdown already under way runs to its end)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
