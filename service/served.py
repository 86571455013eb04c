"""A model version as a frontend serves it: manifest, tokenizer, and a handle on the engine that runs it.

The handle is all the HTTP layer and the task modules (service.tasks) see of the engine:
`EncoderHandle.run` takes a request's tokenized sequences and gives back each one's outputs; a generator is
a `TokenStreams`. Behind them sits either the engine in this process (`local_model`: tests, embedding)
or the engine core process over IPC (service.client). Either way the frontend tokenizes and
post-processes; the engine only batches and runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.batch_policy import ItemTiming
from service.batching import MicroBatcher, all_or_none
from service.engine_plan import EnginePlan
from service.generation.engine import EngineHooks, GenerationEngine, TokenStreams
from service.ipc import Placement
from service.manifest import Manifest
from service.metrics import Metrics
from service.repository import ModelVersion, OfVersion
from service.runtime import EngineModel
from service.settings import Settings
from service.stats import ModelStats
from service.tasks.chat_template import ChatTemplate, compile_chat_template
from service.tokenization import EncodedText, TextEncoder

Outputs = dict[str, np.ndarray]


class EncoderHandle(Protocol):
    async def run(
        self,
        rows: Sequence[EncodedText],
        timeout_s: float,
        timings: list[ItemTiming],
        shadow: bool = False,
        traced: bool = False,
        priority: int = 0,
    ) -> list[Outputs]:
        """Every row's outputs, all or none: a 429 or 504 for one leaves none queued. `timings` gets
        one entry per row (queue wait, engine time, which engine call) as they become known. `shadow`:
        the lowest priority, refused or dropped first under load (service.batching). `traced`: a sampled
        request's rows, whose engine calls get spans; each row's timing then names its call's span.
        `priority`: the client's, lower first among client rows."""
        ...


@dataclass
class ServedModel(OfVersion):
    version: ModelVersion
    encoder: TextEncoder  # the tokenizer: frontends tokenize, the engine never sees text
    placement: Placement
    encoding: EncoderHandle | None = None  # encoder tasks
    generator: TokenStreams | None = None  # text generation
    stats: ModelStats = field(default_factory=ModelStats)  # Triton's statistics, this frontend's share
    # the chat template, compiled once here (None, and why not, for a model that cannot chat)
    chat: ChatTemplate | None = field(init=False, default=None)
    no_chat_reason: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.manifest.task == "text-generation":
            self.chat, self.no_chat_reason = compile_chat_template(self.manifest.chat)

    @property
    def can_chat(self) -> bool | None:
        """Whether /v1/chat/completions serves it (a generation model exported with a chat template); None
        for a model that does not generate, so that clients tell "cannot chat" from "not a chat question"."""
        return self.chat is not None if self.manifest.task == "text-generation" else None

    @property
    def variant(self) -> str:
        return self.placement.variant

    @property
    def provider(self) -> str:
        return self.placement.provider

    @property
    def plan(self) -> EnginePlan:
        return EnginePlan(self.placement.instances, self.placement.threads)

    def describe(self) -> dict[str, object]:
        m = self.manifest
        mask = m.special_tokens.mask
        return {
            "name": m.name,
            "version": m.version,
            "task": m.task,
            "variant": self.variant,
            "provider": self.provider,
            "instances": self.placement.instances,
            "threads_per_instance": self.placement.threads,
            "labels": [m.labels[i] for i in sorted(m.labels)],
            "max_sequence_length": m.max_sequence_length,
            "variants": sorted(m.variants),
            "rejected_variants": m.rejected_variants,
            "mask_token": self.encoder.id_to_token(mask)
            if mask is not None and m.task == "fill-mask"
            else None,
            "distillation": m.distillation.model_dump() if m.distillation else None,
            "chat": self.can_chat,
            "embedding": m.embedding.model_dump() if m.embedding else None,
        }


def same_interface(a: Manifest, b: Manifest) -> bool:
    """Whether a request tokenized for `a`, and post-processed as `a`'s answer, can be run by `b` (a new
    version of a model, retrained: the same tokenizer, labels, task, window and outputs)."""
    return (
        a.task == b.task
        and a.tokenizer.sha256 == b.tokenizer.sha256
        and a.labels == b.labels
        and a.max_sequence_length == b.max_sequence_length
        and a.outputs == b.outputs
    )


def text_encoder(version: ModelVersion) -> TextEncoder:
    manifest = version.manifest
    return TextEncoder(version.file(manifest.tokenizer.file), manifest.tokenizer)


def stream_hooks(metrics: Metrics, model: str) -> EngineHooks:
    """What a frontend measures of a stream: time to first token and between tokens."""
    return EngineHooks(
        on_first_token=metrics.time_to_first_token.labels(model).observe,
        on_token=metrics.inter_token_latency.labels(model).observe,
    )


# -- the engine in this process ---------------------------------------------------------------------------


class LocalEncoder:
    """A request's rows straight into the model's micro-batcher."""

    def __init__(self, batcher: MicroBatcher[EncodedText, Outputs]) -> None:
        self.batcher = batcher

    async def run(
        self,
        rows: Sequence[EncodedText],
        timeout_s: float,
        timings: list[ItemTiming],
        shadow: bool = False,
        traced: bool = False,
        priority: int = 0,
    ) -> list[Outputs]:
        if len(rows) == 1:  # the common case: no task per row
            timings.append(ItemTiming(traced=traced))
            return [await self.batcher.submit(rows[0], timeout_s, timings[-1], shadow, priority)]
        # QueueTooSmallError, QueueFullError: before anything queues
        self.batcher.check_room(len(rows), priority)
        timings.extend(ItemTiming(traced=traced) for _ in rows)
        return await all_or_none(
            self.batcher.submit(row, timeout_s, timing, shadow, priority)
            for row, timing in zip(rows, timings[-len(rows) :], strict=True)
        )


def local_model(model: EngineModel, settings: Settings, metrics: Metrics) -> ServedModel:
    """A frontend view on an engine model loaded in this process; the engine's statistics are shared."""
    view = ServedModel(model.version, text_encoder(model.version), model.placement(), stats=model.stats)
    if model.batcher is not None:
        view.encoding = LocalEncoder(model.batcher)
    if model.generation is not None:
        view.generator = GenerationEngine.around(
            model.generation,
            view.encoder.text_stream,
            stream_hooks(metrics, model.name),
            settings.gen_stream_interval_ms / 1000.0,
        )
    return view
