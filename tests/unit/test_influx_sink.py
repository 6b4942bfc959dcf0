"""InfluxDB writes: line protocol, and the exact HTTP requests of the 1.x and 2.x/3.x paths.

No InfluxDB 2.x server can be installed here, so the 2.x path is checked against
a recording HTTP server: endpoint, org, bucket, precision, token and body.
(The 1.x path also runs against the real local influxd in the integration tests.)
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from kdq.influx import InfluxSink, InfluxWriteError, Point, count_points, line_protocol
from tests.conftest import make_config

W0 = 1_700_000_000_000


class Recorder(BaseHTTPRequestHandler):
    requests: list[dict] = []
    status = 204

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        url = urlparse(self.path)
        Recorder.requests.append(
            {"path": url.path, "query": parse_qs(url.query), "headers": dict(self.headers), "body": body.decode()}
        )
        self.send_response(Recorder.status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorder():
    Recorder.requests = []
    Recorder.status = 204
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_line_protocol_escapes_and_types() -> None:
    assert line_protocol(Point("orders", W0, {"valid": 6, "invalid": 1})) == f"orders valid=6i,invalid=1i {W0}"
    assert (
        line_protocol(Point("my topic,x", W0, {"ratio": 0.5, "note": 'say "hi"'}, {"env": "a b"}))
        == f'my\\ topic\\,x,env=a\\ b ratio=0.5,note="say \\"hi\\"" {W0}'
    )


def test_count_points_fill_missing_status_with_zero() -> None:
    points = count_points([{"topic": "orders", "window_start_ms": W0, "valid": 0, "invalid": 1}])
    assert points == [Point("orders", W0, {"valid": 0, "invalid": 1})]


def test_influxdb_2_requests(recorder, tmp_path) -> None:
    config = make_config(
        tmp_path,
        influxdb={"version": 2, "url": recorder, "org": "acme", "bucket": "quality", "token": "s3cret"},
    )
    InfluxSink(config).write([Point("orders", W0, {"valid": 6, "invalid": 1})])
    assert len(Recorder.requests) == 1
    request = Recorder.requests[0]
    assert request["path"] == "/api/v2/write"
    assert request["query"] == {"org": ["acme"], "bucket": ["quality"], "precision": ["ms"]}
    assert request["headers"]["Authorization"] == "Token s3cret"
    assert request["body"] == f"orders valid=6i,invalid=1i {W0}"


def test_influxdb_1_requests(recorder, tmp_path) -> None:
    config = make_config(
        tmp_path,
        influxdb={"version": 1, "url": recorder, "database": "dq", "retention_policy": "week", "username": "u", "password": "p"},
    )
    InfluxSink(config).write([Point("orders", W0, {"valid": 6, "invalid": 1})])
    request = Recorder.requests[0]
    assert request["path"] == "/write"
    assert request["query"] == {"db": ["dq"], "precision": ["ms"], "rp": ["week"]}
    assert request["headers"]["Authorization"].startswith("Basic ")
    assert request["body"] == f"orders valid=6i,invalid=1i {W0}"


def test_failing_server_is_retried_then_reported(recorder, tmp_path) -> None:
    Recorder.status = 500
    config = make_config(tmp_path, influxdb={"version": 1, "url": recorder, "retries": 2})
    with pytest.raises(InfluxWriteError, match="after 3 attempts"):
        InfluxSink(config).write([Point("orders", W0, {"valid": 1})])
    assert len(Recorder.requests) == 3
