"""The engine core's models as a frontend's task code sees them: an encoder model's request goes in one
message and comes back in one (`RemoteEncoder`); a generation model's tokens come back each step and stream
from here (`RemoteGenerator`). Both speak through the frontend's one connection (service.client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from service import ipc
from service.batch_policy import DeadlineExceededError, ItemTiming
from service.generation.engine import TokenStreams
from service.generation.sequence import Sequence as GenSequence
from service.manifest import Manifest
from service.model_control import ModelRetiredError
from service.served import Outputs, ServedModel, stream_hooks
from service.tokenization import EncodedText

if TYPE_CHECKING:
    from service.client import RemoteEngine


class RemoteEncoder:
    """An encoder model in the core: a request's rows go in one message and come back in one."""

    def __init__(self, engine: RemoteEngine, manifest: Manifest) -> None:
        self.engine, self.manifest = engine, manifest
        self.model, self.version = manifest.name, manifest.version
        self._hop = engine.metrics.ipc_duration.labels(self.model)
        self._late_s = engine.settings.worker_timeout_s  # a running engine call is waited for, not forever

    async def run(
        self,
        rows: Sequence[EncodedText],
        timeout_s: float,
        timings: list[ItemTiming],
        shadow: bool = False,
        traced: bool = False,
        priority: int = 0,
    ) -> list[Outputs]:
        try:
            return await self._run(rows, timeout_s, timings, shadow, traced, priority)
        except ModelRetiredError:
            # Unloaded since this request chose it (it chose another model in between: a cascade's teacher,
            # a reader after its embedder): the version now served in its place answers, when the request's
            # tokens and outputs mean the same to it; else 503, and the client's retry finds it.
            successor = self.engine.successor(self.manifest)
            if successor is None or successor.encoding is None:
                raise
            return await successor.encoding.run(rows, timeout_s, timings, shadow, traced, priority)

    async def _run(
        self,
        rows: Sequence[EncodedText],
        timeout_s: float,
        timings: list[ItemTiming],
        shadow: bool,
        traced: bool,
        priority: int,
    ) -> list[Outputs]:
        engine = self.engine
        request_id = engine.next_id()
        future = engine.expect(request_id, self._hop)
        try:
            sent = ipc.encode_request(
                request_id, self.model, self.version, timeout_s, rows, shadow, traced, priority
            )
            engine.send(sent)
        except BaseException:
            engine.forget(request_id)
            raise
        # A plain timer, not wait_for (a second future and a callback per request): the core answers 504
        # itself for work still queued at the deadline; this only ends a wait for a core gone silent.
        late = asyncio.get_running_loop().call_later(
            timeout_s + self._late_s, self._too_late, future, timeout_s
        )
        try:
            message, frames = await future
        except asyncio.CancelledError:
            engine.abort(request_id)  # the client left: its rows leave the core's queue
            raise
        except DeadlineExceededError:
            engine.abort(request_id)
            raise
        finally:
            late.cancel()
            engine.forget(request_id)
        for queue_s, run_s, batch in zip(message.queue_s, message.run_s, message.batches, strict=True):
            timings.append(ItemTiming(queue_s, run_s, None if batch < 0 else batch, traced))
        if message.spans:  # a traced request's: each row's engine call's span, for its link
            for timing, span in zip(timings[-len(message.spans) :], message.spans, strict=True):
                timing.batch_span = span
        return ipc.result_rows(message, frames)

    @staticmethod
    def _too_late(future: asyncio.Future[tuple[ipc.Encoded, list[bytes]]], timeout_s: float) -> None:
        if not future.done():
            future.set_exception(DeadlineExceededError(f"no answer from the engine within {timeout_s:g} s"))


class RemoteGenerator(TokenStreams):
    """A generation model in the core: prompts go in, each step's tokens come back and stream from here."""

    def __init__(self, engine: RemoteEngine, model: ServedModel) -> None:
        self.engine = engine
        self.model, self.version = model.name, model.manifest.version
        settings = engine.settings
        super().__init__(
            model.encoder.text_stream,
            admit=self._admit,
            release=self._release,
            max_cached_tokens=settings.gen_max_cached_tokens,
            hooks=stream_hooks(engine.metrics, model.name),
            stream_interval_s=settings.gen_stream_interval_ms / 1000.0,
        )

    def _admit(self, seq: GenSequence) -> None:
        message = ipc.Generate(seq.id, self.model, self.version, seq.prompt, seq.params)
        self.engine.send(ipc.pack(message))
        self.engine.add_stream(self, seq)

    def _release(self, seq: GenSequence) -> None:
        if self.engine.drop_stream(seq):
            self.engine.abort(seq.id)
