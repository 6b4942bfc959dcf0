"""The local stack's addresses, as ``<data_dir>/stack/state.json`` records them, read once per Config.

`kdq up` (:mod:`kdq.stack.manager`) chooses the ports of the local broker, InfluxDB and Schema Registry and records
them in the state file, with the stack's shape (one broker and Spark in local mode, or the cluster's brokers and
standalone master). A :class:`~kdq.config.model.Config` reads them when it is built, so its answers
(``kafka_bootstrap()``, ``spark_master()``, ``influx_url()``, ``registry_url()``) do not change under it when the file
does. A process that records new addresses (the stack's start) or waits for another one to (a test around
`kdq run`) takes ``config.reload_stack_addresses()``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StackAddresses:
    """What a Config's addresses default to, as read from the state file (values as recorded; nothing read is
    ``None``). ``unreadable``: why the file could not be read (not JSON, no permission): raised by the address that
    needs it, as a read at that moment would have, so a config whose addresses are all configured never sees it."""

    kafka_bootstrap: str | None = None  # every broker of the cluster shape (kdq up --cluster)
    kafka_port: int | None = None  # the single broker's
    cluster: bool | None = None
    spark_master: str | None = None  # the standalone master of the cluster shape
    influx_port: int | None = None
    registry_port: int | None = None
    registry_started: bool | None = None  # started by `make run` (or `kdq up`), until `kdq down`
    unreadable: Exception | None = None

    @classmethod
    def read(cls, state_file: Path) -> StackAddresses:
        """The addresses ``state_file`` records now; none when there is no such file (no stack started yet)."""
        try:
            state: dict[str, Any] = json.loads(state_file.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            return cls(unreadable=exc)
        if not isinstance(state, dict):  # as state.get would have failed
            return cls(unreadable=AttributeError(f"{type(state).__name__!r} object has no attribute 'get'"))
        return cls(
            kafka_bootstrap=state.get("kafka_bootstrap"),
            kafka_port=state.get("kafka_port"),
            cluster=state.get("cluster"),
            spark_master=state.get("spark_master"),
            influx_port=state.get("influx_port"),
            registry_port=state.get("registry_port"),
            registry_started=state.get("registry_started"),
        )

    def recorded(self) -> StackAddresses:
        """These addresses, or the error that kept the file from being read."""
        if self.unreadable is not None:
            raise self.unreadable
        return self
