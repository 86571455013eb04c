"""OpenTelemetry tracing of requests and engine batches, configured by the standard `OTEL_*` variables.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED`
is not true): the SDK's OTLP exporter (http/protobuf, as the SDK defaults) reads the endpoint, headers,
timeout, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` and the sampler (`OTEL_TRACES_SAMPLER`, default
parent-based always-on) itself. Off, the SDK is never imported, a request pays a few `is None` checks and
the batchers nothing.

Requests. A request's spans are written once it is answered (HTTP: service.api.access, gRPC:
service.api.grpc_v2), from what its exchange recorded on the way (service.exchange.Phase): the server span
(a W3C `traceparent` from the client, in its headers or gRPC metadata, is its parent), and under it
tokenization, the queue wait, each engine call the request's rows rode in (`engine`), post-processing, and
for generation `prefill` and `decode` (service.tasks.generation_base). Only a sampled request records its
phases. Recording times as plain numbers and making spans afterwards keeps the hot path free of span objects
and context switches; the timestamps are the real ones.

Engine batches. The process that runs an encoder's batches (the engine core; in one process, the app's own)
makes one `engine batch` span per engine call that carried a sampled request's row, once the call is done,
from the micro-batcher's `BatchStats` (model, version, batch number, size, real and padded tokens, run time).
A batch serves several traces, so its span is the root of a trace of its own; its span context goes back with
each traced row (`ItemTiming.batch_span`; across processes `ipc.Encoded.spans`) and the request's `engine`
span carries a link to it. The engine follows its requests' sampling decision: a batch span is made only for
a batch holding a sampled request's row, and always kept, so `OTEL_TRACES_SAMPLER` decides for both and a
link never points at a span that was dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Link, Span, Tracer

    from service.batch_policy import BatchStats
    from service.exchange import Phase

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
BATCH_SPAN = "engine batch"


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class Tracing:
    """A tracer of the service's own (never the global provider: each app, and each test, its own)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.context import Context
        from opentelemetry.propagate import extract
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, set_span_in_context
        from opentelemetry.trace.status import Status, StatusCode

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("distilserve")
        self._extract, self._in = extract, set_span_in_context
        self._server, self._internal = SpanKind.SERVER, SpanKind.INTERNAL
        self._link, self._context, self._sampled = Link, SpanContext, TraceFlags(TraceFlags.SAMPLED)
        self._root = Context()  # a batch span's: none of its requests is its parent
        self._failed = Status(StatusCode.ERROR, "the engine call failed")
        # perf_counter (what requests record) and monotonic (the batcher's clock) to the epoch nanoseconds
        # spans carry
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._monotonic_offset_ns = time.time_ns() - time.monotonic_ns()

    def epoch_ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)

    def start(self, name: str, carrier: Mapping[str, str], started_s: float) -> Span:
        """The request's server span, child of the client's `traceparent` (in `carrier`: HTTP headers or
        gRPC metadata, lower-case names) when it sent one."""
        context = self._extract(carrier)
        return self.tracer.start_span(
            name, context=context, kind=self._server, start_time=self.epoch_ns(started_s)
        )

    def finish(
        self, span: Span, phases: Sequence[Phase], attributes: Mapping[str, Any], ended_s: float
    ) -> None:
        """The phases as the server span's children (with their links and events), its attributes, and
        its end."""
        parent = self._in(span)
        for phase in phases:
            child = self.tracer.start_span(
                phase.name,
                context=parent,
                start_time=self.epoch_ns(phase.start_s),
                attributes=phase.attributes,
                links=[self._link_to(ref) for ref in phase.links] if phase.links else None,
            )
            for name, at_s, event_attributes in phase.events:
                child.add_event(name, event_attributes, timestamp=self.epoch_ns(at_s))
            child.end(end_time=self.epoch_ns(phase.end_s))
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)
        span.end(end_time=self.epoch_ns(ended_s))

    def batch_tracer(self, model: str, version: int) -> Callable[[BatchStats], str]:
        """What a model's micro-batcher calls for an engine call that carried a sampled request's row (on
        the event loop, once the call is done): its `engine batch` span, and the reference to it its rows
        carry back (`span_ref`)."""

        def trace(stats: BatchStats) -> str:
            start = self._monotonic_offset_ns + int(stats.started_s * 1e9)
            attributes: dict[str, str | int | float] = {
                "model": model,
                "version": version,
                "batch": stats.batch,
                "size": stats.size,
                "real_tokens": stats.real_tokens,
                "padded_tokens": stats.padded_tokens,
                "run_s": stats.run_s,
                "queue_wait_max_s": max(stats.queue_wait_s, default=0.0),
            }
            span = self.tracer.start_span(
                BATCH_SPAN, context=self._root, kind=self._internal, start_time=start, attributes=attributes
            )
            if stats.failed:
                span.set_status(self._failed)
            span.end(end_time=start + int(stats.run_s * 1e9))
            return span_ref(span)

        return trace

    def _link_to(self, ref: str) -> Link:
        trace_id, _, span_id = ref.partition("-")
        context = self._context(int(trace_id, 16), int(span_id, 16), True, self._sampled)
        return self._link(context)

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes what the batch processor holds


def setup_tracing(role: str, environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The process's tracing when the environment asks for it, else None (and the SDK never imported)."""
    if not tracing_requested(environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {SERVICE_NAME: environ.get("OTEL_SERVICE_NAME", "distilserve"), "distilserve.role": role}
    )
    requests = TracerProvider(shutdown_on_exit=False).sampler  # OTEL_TRACES_SAMPLER(_ARG), as the SDK reads
    provider = TracerProvider(resource=resource, sampler=_engine_follows(requests))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider)


def _engine_follows(requests: Sampler) -> Sampler:
    """`requests` for every span but a batch's, which is always kept: it is only made for a batch that
    carries a sampled request's row (the engine follows its requests' decision)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler, SamplingResult

    class EngineFollowsRequests(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            chosen = ALWAYS_ON if name == BATCH_SPAN else requests
            return chosen.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"EngineFollowsRequests{{{requests.get_description()}}}"

    return EngineFollowsRequests()


def span_ref(span: Span) -> str:
    """A span's trace and span ids as one string (`<32 hex>-<16 hex>`): what travels back with a traced row
    (plain data, and msgpack's integers stop at 64 bits) for its request's link."""
    context = span.get_span_context()
    return f"{context.trace_id:032x}-{context.span_id:016x}"


def trace_id_of(span: Span) -> str:
    """The span's trace id as W3C writes it (32 hex digits), for the access log."""
    return format(span.get_span_context().trace_id, "032x")
