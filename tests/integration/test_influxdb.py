"""The real local InfluxDB 1.x: line protocol in, InfluxQL out, an overwritten point keeps the new value."""

from __future__ import annotations

import requests

from kdq.stack.manager import LocalStack


def _query(url: str, db: str, q: str) -> list[list]:
    response = requests.get(f"{url}/query", params={"db": db, "q": q, "epoch": "ms"}, timeout=10)
    response.raise_for_status()
    series = response.json()["results"][0].get("series", [])
    return series[0]["values"] if series else []


def test_write_overwrite_and_query(local_stack: LocalStack) -> None:
    url, db = local_stack.influx.url, local_stack.config.influxdb.database
    body = "orders valid=5i,invalid=1i 1700000000000\norders valid=0i,invalid=1i 1700000001000\n"
    write = requests.post(f"{url}/write", params={"db": db, "precision": "ms"}, data=body, timeout=10)
    assert write.status_code == 204, write.text
    # Same series and timestamp: InfluxDB replaces the field values (how corrections land).
    write = requests.post(
        f"{url}/write", params={"db": db, "precision": "ms"}, data="orders valid=6i 1700000000000\n", timeout=10
    )
    assert write.status_code == 204, write.text
    rows = _query(url, db, "SELECT valid, invalid FROM orders")
    assert rows == [[1700000000000, 6, 1], [1700000001000, 0, 1]]
