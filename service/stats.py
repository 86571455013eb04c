"""Per-model inference statistics, the counts and times Triton's statistics extension reports.

Plain integers, kept in this process: a few additions per request and per engine call, with no lock and no
label lookup (a Prometheus series costs ~5 us a `labels()` call). Each field has one writer: the event
loop records requests and the micro-batcher's engine calls (its `on_batch` runs on the loop); a generation
engine's calls are recorded on its one engine thread. A reader may see a call's count before its time:
never a lost update. Under several worker processes each keeps its own (unlike /metrics, they are not
summed across workers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from service.exchange import Exchange


@dataclass(slots=True)
class Duration:
    """How many times something happened and how long it took in all (Triton's `{count, ns}`)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)


@dataclass(slots=True)
class ModelStats:
    """One served model version's statistics since start-up.

    Per request (every protocol: /v1 and /v2 alike): `success` and `fail` with their end-to-end time,
    `inference_count` += the request's batch (texts, pairs or prompts), and for a success its longest
    queue wait, its tokenization (Triton's compute_input: turning input tensors into what the model takes)
    and the engine calls it took part in. Per engine call: `execution_count` and the calls by batch size.
    """

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    inference_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, Duration] = field(default_factory=dict)  # batch size -> its engine calls

    def observe_request(self, ok: bool, seconds: float, x: Exchange) -> None:
        """A request for this model ended: ok (a 2xx or 3xx) or not, after `seconds` end to end."""
        if not ok:
            self.fail.add(seconds)
            return
        self.success.add(seconds)
        self.inference_count += x.items
        if x.queue_s is not None:
            self.queue_ns += int(x.queue_s * 1e9)
        if x.tokenize_s is not None:
            self.compute_input_ns += int(x.tokenize_s * 1e9)
        if x.inference_s is not None:
            self.compute_infer_ns += int(x.inference_s * 1e9)

    def observe_execution(self, size: int, seconds: float) -> None:
        """One successful engine call on `size` sequences, `seconds` long."""
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        batch = self.batches.get(size)
        if batch is None:
            batch = self.batches[size] = Duration()
        batch.add(seconds)
