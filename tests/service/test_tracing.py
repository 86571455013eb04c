"""OpenTelemetry tracing: spans reach an OTLP receiver with the client's trace id, nested as documented; each
traced engine batch is one span its requests' engine spans link to, in one process and across the engine
core's; generation's prefill and decode; gRPC's requests as HTTP's; off, nothing is sent."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi.testclient import TestClient

from service.app import create_app
from service.batch_policy import BatchPolicy, BatchStats, ItemTiming
from service.batching import MicroBatcher
from service.engine import Engine
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.service.live_server import free_port
from tests.service.supervised import serving

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Receiver(ThreadingHTTPServer):
    """An in-process OTLP/HTTP trace receiver: every span it is sent, flattened."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict[str, Any]] = []
        self.posts = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        self.server.posts += 1
        for resource in request.resource_spans:
            role = {a.key: _value(a.value) for a in resource.resource.attributes}.get("distilserve.role")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.server.spans.append(
                        {
                            "name": span.name,
                            "role": role,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            "events": [
                                (e.name, e.time_unix_nano, {a.key: _value(a.value) for a in e.attributes})
                                for e in span.events
                            ],
                            "error": span.status.code == span.status.STATUS_CODE_ERROR,
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


# -- helpers ------------------------------------------------------------------------------------------------


def traced(trace_id: str, span: str = CLIENT_SPAN, sampled: bool = True) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{span}-{'01' if sampled else '00'}"}


def server_span(receiver: Receiver, trace_id: str, name: str) -> dict[str, Any]:
    (found,) = [s for s in receiver.spans if s["trace_id"] == trace_id and s["name"] == name]
    return found


def children(receiver: Receiver, parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in receiver.spans if s["parent"] == parent["span_id"]]


def linked_batch(receiver: Receiver, engine: dict[str, Any]) -> dict[str, Any]:
    """The exported `engine batch` span an `engine` span links to (exactly one)."""
    ((trace_id, span_id),) = engine["links"]
    (batch,) = [
        s for s in receiver.named("engine batch") if (s["trace_id"], s["span_id"]) == (trace_id, span_id)
    ]
    return batch


def assert_each_batch_once(receiver: Receiver) -> None:
    """One span per engine call: no batch number twice in one process."""
    keys = [
        (s["role"], s["attributes"]["model"], s["attributes"]["batch"])
        for s in receiver.named("engine batch")
    ]
    assert keys and len(keys) == len(set(keys))


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


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
    batch = linked_batch(receiver, engine)  # the engine call's own span, in a trace of its own
    assert batch["trace_id"] != TRACE_ID and batch["parent"] == ""
    assert batch["attributes"]["model"] == "tiny-cls" and batch["attributes"]["version"] >= 1
    assert batch["attributes"]["batch"] == engine["attributes"]["batch"]
    assert batch["attributes"]["size"] >= engine["attributes"]["rows"]
    assert batch["attributes"]["padded_tokens"] >= batch["attributes"]["real_tokens"] > 0
    assert batch["attributes"]["run_s"] > 0 and not batch["error"]
    assert abs(batch["start"] - engine["start"]) < 50e6 and abs(batch["end"] - engine["end"]) < 50e6
    assert_each_batch_once(receiver)
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
    app = create_app(Settings(model_repository=tiny_repository))
    with TestClient(app) as client:
        assert client.post("/v1/classify", json={"inputs": "fine"}, headers=headers).status_code == 200
        generate = {"prompt": "The film was", "max_new_tokens": 3}
        assert client.post("/v1/generate", json=generate, headers=headers).status_code == 200
        assert app.state.metrics.tracing is None  # no tracer: the batchers make no spans
    assert receiver.posts == 0


def test_the_sdk_can_be_switched_off_with_an_endpoint_set(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_address[1]}")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as client:
        assert client.post("/v1/classify", json={"inputs": "fine"}).status_code == 200
    assert receiver.posts == 0


# -- engine batches -----------------------------------------------------------------------------------------


def test_a_batcher_traces_only_calls_carrying_a_traced_item_and_never_fails_for_it() -> None:
    """The micro-batcher's side, without OpenTelemetry: `trace_batch` gets the calls holding a traced item,
    its reference goes back on those items' timings, and a tracer that fails costs the link, not the call."""
    made: list[BatchStats] = []

    def trace(stats: BatchStats) -> str:
        made.append(stats)
        if len(made) == 2:
            raise RuntimeError("exporter trouble")
        return f"span-{stats.batch}"

    async def main() -> list[ItemTiming]:
        timings = [ItemTiming(traced=flag) for flag in (False, True, True)]
        with ThreadPoolExecutor(max_workers=1) as executor:
            batcher: MicroBatcher[str, str] = MicroBatcher(
                lambda items: [i * 2 for i in items],
                BatchPolicy(),
                cost=len,
                executor=executor,
                trace_batch=trace,
            )
            batcher.start()
            for i, timing in enumerate(timings):  # one after the other: a call each
                assert await batcher.submit(f"x{i}", timing=timing) == f"x{i}" * 2
            await batcher.close()
        return timings

    untraced, traced_ok, traced_failed = asyncio.run(main())
    assert [s.batch for s in made] == [traced_ok.batch, traced_failed.batch]
    assert made[0].size == 1 and made[0].started_s > 0 and made[0].run_s >= 0
    assert untraced.batch_span == "" and traced_failed.batch_span == ""
    assert traced_ok.batch_span == f"span-{traced_ok.batch}"


class HeldEngine:
    """The classifier's engine, whose calls wait until `go` is set; `calls` counts those begun."""

    def __init__(self, inner: Engine, go: threading.Event) -> None:
        self.inner, self.go = inner, go
        self.provider, self.input_names = inner.provider, inner.input_names
        self.calls = 0

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        self.go.wait(60)
        return self.inner.run(feeds)


def test_requests_riding_one_engine_call_link_to_its_one_span(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holds the engine; B and C queue meanwhile and ride the next call together: their engine spans link
    to one span of a batch of two, A's to its own."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    go = threading.Event()
    engines: list[HeldEngine] = []

    def factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
        engine = ort_engine_factory(version, variant, settings)
        if version.manifest.task != "text-classification":
            return engine
        engines.append(HeldEngine(engine, go))
        return engines[-1]

    traces = {name: f"{i + 1:032x}" for i, name in enumerate("abc")}
    settings = Settings(model_repository=tiny_repository, warmup=False, instances=1, max_wait_ms=0)
    app = create_app(settings, engine_factory=factory)

    async def scenario() -> list[int]:
        async with (
            LifespanManager(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client,
        ):

            async def classify(name: str) -> int:
                r = await client.post(
                    "/v1/classify", json={"inputs": "a fine film"}, headers=traced(traces[name])
                )
                return r.status_code

            queued = app.state.metrics.registry
            first = asyncio.create_task(classify("a"))
            await _until(lambda: bool(engines) and engines[0].calls == 1, "A's engine call began")
            rest = [asyncio.create_task(classify(name)) for name in "bc"]
            depth = {"model": "tiny-cls"}
            await _until(
                lambda: queued.get_sample_value("distilserve_queue_depth", depth) == 2, "B, C queued"
            )
            go.set()
            return list(await asyncio.gather(first, *rest))

    assert asyncio.run(scenario()) == [200, 200, 200]
    batches = {}
    for name, trace_id in traces.items():
        server = server_span(receiver, trace_id, "POST /v1/classify")
        (engine,) = [s for s in children(receiver, server) if s["name"] == "engine"]
        batches[name] = linked_batch(receiver, engine)
    assert batches["b"] is batches["c"] and batches["b"]["attributes"]["size"] == 2
    assert batches["a"] is not batches["b"] and batches["a"]["attributes"]["size"] == 1
    assert_each_batch_once(receiver)


def test_the_engine_follows_its_requests_sampling(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parent-based always-off: only a request whose client sampled it is traced, and only its engine call
    gets a span; a request nobody sampled costs no span anywhere."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    with TestClient(create_app(Settings(model_repository=tiny_repository, warmup=False))) as client:
        for headers in ({}, traced(TRACE_ID, sampled=False), traced(TRACE_ID)):
            assert client.post("/v1/classify", json={"inputs": "fine"}, headers=headers).status_code == 200
    server = server_span(receiver, TRACE_ID, "POST /v1/classify")
    (engine,) = [s for s in children(receiver, server) if s["name"] == "engine"]
    assert receiver.named("engine batch") == [linked_batch(receiver, engine)]
    assert {s["trace_id"] for s in receiver.spans} == {TRACE_ID, linked_batch(receiver, engine)["trace_id"]}


def test_the_engine_cores_batches_are_traced_across_processes(
    tiny_repository: Path, receiver: Receiver
) -> None:
    """`python -m service`: the engine core exports its batch spans itself, and the span ids travel back
    to the frontend over IPC for the request's link."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "DISTILSERVE_FRONTENDS": "1"}
    with serving(tiny_repository, env) as service:
        r = httpx.post(
            f"{service.base_url}/v1/classify", json={"inputs": ["fine", "awful"]}, headers=traced(TRACE_ID)
        )
        assert r.status_code == 200
        assert service.stop() == 0  # SIGTERM: each process flushes its spans as it stops
    server = server_span(receiver, TRACE_ID, "POST /v1/classify")
    engines = [s for s in children(receiver, server) if s["name"] == "engine"]
    assert engines and server["role"] == "frontend"
    for engine in engines:
        batch = linked_batch(receiver, engine)
        assert (
            batch["role"] == "engine-core" and batch["attributes"]["batch"] == engine["attributes"]["batch"]
        )
    assert_each_batch_once(receiver)


# -- generation and gRPC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_generation_has_a_prefill_and_a_decode_span(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    body = {"prompt": "The film was", "max_new_tokens": 6, "ignore_eos": True, "stream": stream}
    with TestClient(create_app(Settings(model_repository=tiny_repository, warmup=False))) as client:
        r = client.post("/v1/generate", json=body, headers=traced(TRACE_ID))
        assert r.status_code == 200
    server = server_span(receiver, TRACE_ID, "POST /v1/generate")
    phases = {s["name"]: s for s in children(receiver, server)}
    assert {"tokenize", "prefill", "decode"} <= set(phases)
    prefill, decode = phases["prefill"], phases["decode"]
    assert phases["tokenize"]["end"] <= prefill["start"] <= prefill["end"] == decode["start"] <= decode["end"]
    assert decode["end"] <= server["end"]
    assert prefill["attributes"]["prompt_tokens"] >= 1
    assert decode["attributes"]["tokens"] == 6 and decode["attributes"]["finish_reason"] == "length"
    events = decode["events"]  # every token after the first (a long output: the first TRACED_TOKENS only)
    assert [e[2]["index"] for e in events] == [1, 2, 3, 4, 5]
    assert all(decode["start"] <= e[1] <= decode["end"] for e in events)


def test_a_grpc_model_infer_is_traced_as_an_http_request(
    tiny_repository: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    port = free_port()
    settings = Settings(model_repository=tiny_repository, warmup=False, grpc_port=port)
    request = service_pb2.ModelInferRequest(model_name="tiny-cls")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([b"a fine film", b"a dull one"])
    with TestClient(create_app(settings, grpc=True)), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request, metadata=tuple(traced(TRACE_ID).items()), timeout=60)
    server = server_span(receiver, TRACE_ID, "inference.GRPCInferenceService/ModelInfer")
    assert server["parent"] == CLIENT_SPAN
    assert (
        server["attributes"]["rpc.grpc.status_code"] == 0
        and server["attributes"]["distilserve.status"] == 200
    )
    assert server["attributes"]["distilserve.model"] == "tiny-cls"
    phases = {s["name"]: s for s in children(receiver, server)}
    assert {"tokenize", "queue", "engine", "postprocess"} <= set(phases)
    linked_batch(receiver, phases["engine"])
