"""OpenTelemetry tracing of HTTP requests, configured by the standard `OTEL_*` variables.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED`
is not true): the SDK's OTLP exporter (http/protobuf, as the SDK defaults) reads the endpoint, headers,
timeout, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` and the sampler (`OTEL_TRACES_SAMPLER`, default
parent-based always-on) itself. Off, nothing of OpenTelemetry is imported and a request pays one `is None`.

A request's spans are written once it is answered, from what its exchange recorded on the way
(service.exchange.Phase): the server span (a W3C `traceparent` from the client is its parent), and under it
tokenization, the queue wait, each engine call (batch) the request's rows rode in, and post-processing.
Recording times as plain numbers and making spans afterwards keeps the hot path free of span objects and
context switches; the timestamps are the real ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from service.exchange import Phase

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class Tracing:
    """A tracer of the service's own (never the global provider: each app, and each test, its own)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind, set_span_in_context

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("distilserve")
        self._extract, self._server, self._in = extract, SpanKind.SERVER, set_span_in_context
        # perf_counter (what the request records) to the epoch nanoseconds spans carry
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def epoch_ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)

    def start(self, name: str, headers: Sequence[tuple[bytes, bytes]], started_s: float) -> Span:
        """The request's server span, child of the client's `traceparent` when it sent one."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        context = self._extract(carrier)
        return self.tracer.start_span(
            name, context=context, kind=self._server, start_time=self.epoch_ns(started_s)
        )

    def finish(
        self, span: Span, phases: Sequence[Phase], attributes: Mapping[str, Any], ended_s: float
    ) -> None:
        """The phases as the server span's children, its attributes, and its end."""
        parent = self._in(span)
        for phase in phases:
            child = self.tracer.start_span(
                phase.name, context=parent, start_time=self.epoch_ns(phase.start_s)
            )
            for key, value in phase.attributes.items():
                child.set_attribute(key, value)
            child.end(end_time=self.epoch_ns(phase.end_s))
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)
        span.end(end_time=self.epoch_ns(ended_s))

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes what the batch processor holds


def setup_tracing(role: str, environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The process's tracing when the environment asks for it, else None (and nothing imported)."""
    if not tracing_requested(environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {SERVICE_NAME: environ.get("OTEL_SERVICE_NAME", "distilserve"), "distilserve.role": role}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider)


def trace_id_of(span: Span) -> str:
    """The span's trace id as W3C writes it (32 hex digits), for the access log."""
    return format(span.get_span_context().trace_id, "032x")
