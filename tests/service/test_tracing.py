"""OpenTelemetry tracing: spans reach an OTLP receiver with the client's trace id, nested as documented; off,
nothing is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Receiver(ThreadingHTTPServer):
    """An in-process OTLP/HTTP trace receiver: every span it is sent, flattened."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict[str, Any]] = []
        self.posts = 0


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        self.server.posts += 1
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.server.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        }
                    )
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_a_requests_spans_arrive_under_the_clients_trace(
    tiny_repository: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from service.logs import ACCESS_LOGGER

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_address[1]}")
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as client:
        r = client.post("/v1/classify", json={"inputs": ["a fine film", "a dull one"]}, headers=headers)
        assert r.status_code == 200
    # the app's shutdown flushed its spans
    ours = [s for s in receiver.spans if s["trace_id"] == TRACE_ID]
    (server,) = [s for s in ours if s["name"] == "POST /v1/classify"]
    assert server["parent"] == CLIENT_SPAN
    assert server["attributes"]["http.response.status_code"] == 200
    assert server["attributes"]["distilserve.model"] == "tiny-cls"
    children = {s["name"]: s for s in ours if s["parent"] == server["span_id"]}
    assert {"tokenize", "queue", "engine", "postprocess"} <= set(children)
    engine = children["engine"]
    assert engine["attributes"]["rows"] >= 1 and "batch" in engine["attributes"]
    for child in children.values():  # inside the request, in order
        assert server["start"] <= child["start"] <= child["end"] <= server["end"]
    assert children["tokenize"]["end"] <= children["queue"]["start"] <= children["engine"]["start"]
    assert children["engine"]["end"] <= children["postprocess"]["start"]
    lines = [r for r in caplog.records if getattr(r, "access", {}).get("path") == "/v1/classify"]
    assert lines and lines[-1].access["trace_id"] == TRACE_ID  # type: ignore[attr-defined]


def test_without_the_otlp_variables_nothing_is_exported(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as client:
        assert client.post("/v1/classify", json={"inputs": "fine"}, headers=headers).status_code == 200
    assert receiver.posts == 0


def test_the_sdk_can_be_switched_off_with_an_endpoint_set(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_address[1]}")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as client:
        assert client.post("/v1/classify", json={"inputs": "fine"}).status_code == 200
    assert receiver.posts == 0
