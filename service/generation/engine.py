"""The generation engine in two halves that meet at plain data: `GenerationCore` (an engine thread that
schedules and runs steps back to back: service.generation.engine_thread) and, here, `TokenStreams` (the event
loop's side: detokenize, stop strings, stream to clients). `GenerationEngine` joins them in one process;
across processes the engine core runs the first and a frontend the second (service.core, service.client).
Each request streams its tokens through its own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from service.generation.engine_thread import GenerationCore, Produced
from service.generation.grammar import Grammars
from service.generation.runner import DecoderRunner, StepResult
from service.generation.sampling import Logprob, SamplingParams
from service.generation.scheduler import Scheduler, StepPlan
from service.generation.sequence import TRACED_TOKENS, Detokenizer, FinishReason, TokenEvent
from service.generation.sequence import Sequence as GenSequence
from service.generation.speculative import SpeculativeRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineHooks:
    """Where the engine reports what it did (metrics); all optional."""

    on_step: Callable[[StepPlan, StepResult], None] | None = None  # called on the engine thread
    on_first_token: Callable[[float], None] | None = None  # seconds since arrival
    on_token: Callable[[float], None] | None = None  # seconds since the previous token
    on_queue: Callable[[int, int], None] | None = None  # running, waiting


class TokenStreams:
    """The event loop's half: turns produced tokens into each client's text and events.

    `admit(seq)` hands a new sequence to the engine (in-process: the core's `add`; remote: a message) and
    `release(seq)` tells it a sequence ended on this side (client gone, stop string)."""

    def __init__(
        self,
        detokenizer: Callable[[], Detokenizer],
        admit: Callable[[GenSequence], None],
        release: Callable[[GenSequence], None],
        max_cached_tokens: int,
        hooks: EngineHooks | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        self._detokenizer = detokenizer  # a new incremental decoder per sequence
        self._admit = admit
        self._release = release
        self.max_cached_tokens = max_cached_tokens
        self._hooks = hooks or EngineHooks()
        self.stream_interval_s = stream_interval_s

    def submit(self, prompt: Sequence[int], params: SamplingParams, traced: bool = False) -> GenSequence:
        """Queue a request (QueueFullError / BatcherClosedError when it cannot be taken). `traced`: a sampled
        request's, which keeps its first tokens' times (`Sequence.token_times`)."""
        seq = GenSequence(prompt=list(prompt), params=params, detokenizer=self._detokenizer())
        if traced:
            seq.token_times = []
        self._admit(seq)
        return seq

    async def stream(self, seq: GenSequence) -> AsyncIterator[TokenEvent]:
        """The sequence's events one by one, as they come, until it finishes."""
        async with contextlib.aclosing(self.stream_groups(seq, interval_s=0.0)) as groups:
            async for group in groups:
                for event in group:
                    yield event

    async def stream_groups(
        self, seq: GenSequence, interval_s: float | None = None
    ) -> AsyncGenerator[list[TokenEvent], None]:
        """The sequence's events until it finishes, handed out at most once per `interval_s` (default: the
        engine's `stream_interval_s`): the first at once, and whenever the last hand-out is that long ago;
        events due sooner wait and go together.

        Every hand-out costs the event loop a task wake-up, a trip through the ASGI middlewares and a socket
        write; at 16 streams on 2 cores that was most of its ~130 us per token. Leaving early (client
        gone) frees the sequence's slot."""
        interval_s = self.stream_interval_s if interval_s is None else interval_s
        loop = asyncio.get_running_loop()
        handed_out = -math.inf
        try:
            while True:
                group = [await seq.events.get()]
                wait = handed_out + interval_s - loop.time()
                if wait > 0 and group[0].finish_reason is None:
                    await asyncio.sleep(wait)
                while not seq.events.empty():
                    group.append(seq.events.get_nowait())
                if seq.error is not None:
                    # Tokens made before the failure still go out (one group), then the failure does.
                    group = [e for e in group if e.token_id is not None]
                    if not group:
                        raise seq.error
                    seq.events.put_nowait(TokenEvent(None, "", None))
                handed_out = loop.time()
                yield group
                if group[-1].finish_reason is not None:
                    return
        finally:
            if seq.finish_reason is None:
                seq.aborted = True
                self._release(seq)

    async def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        traced: bool = False,
        on_event: Callable[[TokenEvent], None] | None = None,
    ) -> tuple[GenSequence, str]:
        """Run to completion; returns the finished sequence and its text (`on_event` sees each event)."""
        seq = self.submit(prompt, params, traced)
        parts = []
        async for event in self.stream(seq):
            parts.append(event.text)
            if on_event is not None:
                on_event(event)
        return seq, "".join(parts)

    def deliver(self, produced: list[Produced]) -> None:
        for seq, token, index, finish, logprob, prompt in produced:
            if seq.ended or seq.error is not None:  # a stop string ended it before this token
                continue
            self._emit(seq, token, index, finish, logprob, prompt)

    def fail(self, seqs: list[GenSequence], error: Exception) -> None:
        for seq in seqs:
            if seq.ended:
                continue
            seq.error = error
            seq.aborted = True
            seq.ended = True
            seq.events.put_nowait(TokenEvent(None, "", None))

    def _emit(
        self,
        seq: GenSequence,
        token: int,
        index: int,
        finish: FinishReason | None,
        logprob: Logprob | None,
        prompt_logprobs: list[Logprob] | None,
    ) -> None:
        """What the client sees: timing metrics, the text the token completes (a stop string ends it)."""
        now = time.perf_counter()
        if seq.last_token_at is None:
            if self._hooks.on_first_token is not None:
                self._hooks.on_first_token(now - seq.arrived_at)
        elif self._hooks.on_token is not None:
            self._hooks.on_token(now - seq.last_token_at)
        seq.last_token_at = now
        if seq.token_times is not None and len(seq.token_times) < TRACED_TOKENS:
            seq.token_times.append(now)
        seq.streamed = index + 1
        stopped = finish != "eos" and self._add_text(seq, token)
        if stopped:
            finish = "stop"
        if finish is not None:
            seq.finish_reason, seq.ended = finish, True
        if stopped:
            self._release(seq)  # the engine drops it at its next step
        seq.events.put_nowait(
            TokenEvent(token, _unsent(seq, final=finish is not None), finish, index, logprob, prompt_logprobs)
        )

    def _add_text(self, seq: GenSequence, token: int) -> bool:
        """Append the text this token completes (nothing mid-character); cut at a stop string, if one
        now appears, and say so."""
        assert seq.detokenizer is not None
        piece = seq.detokenizer.step(token)
        if not piece:
            return False
        before = len(seq.text)
        seq.text += piece
        if seq.streamed < seq.params.min_tokens:
            return False  # no stop string counts before min_tokens (as vLLM's)
        for stop in seq.params.stop:
            at = seq.text.find(stop, max(0, before - len(stop) + 1))
            if at != -1:
                seq.text = seq.text[:at]
                return True
        return False


class GenerationEngine(TokenStreams):
    """Both halves in one process: the core's thread delivers to these streams through the loop."""

    def __init__(
        self,
        runner: DecoderRunner,
        scheduler: Scheduler,
        detokenizer: Callable[[], Detokenizer],
        stop_token_ids: int | Iterable[int] | None,
        executor: Executor,
        hooks: EngineHooks | None = None,
        stream_interval_s: float = 0.0,
        grammars: Grammars | None = None,
    ) -> None:
        hooks = hooks or EngineHooks()
        core = GenerationCore(
            runner,
            scheduler,
            stop_token_ids,
            executor,
            on_step=hooks.on_step,
            on_queue=hooks.on_queue,
            grammars=grammars,
        )
        self._attach(core, detokenizer, hooks, stream_interval_s)

    @classmethod
    def around(
        cls,
        core: GenerationCore,
        detokenizer: Callable[[], Detokenizer],
        hooks: EngineHooks | None = None,
        stream_interval_s: float = 0.0,
    ) -> GenerationEngine:
        """Streams for a core built elsewhere (service.runtime), in this process."""
        engine = cls.__new__(cls)
        engine._attach(core, detokenizer, hooks, stream_interval_s)
        return engine

    def _attach(
        self,
        core: GenerationCore,
        detokenizer: Callable[[], Detokenizer],
        hooks: EngineHooks | None,
        stream_interval_s: float,
    ) -> None:
        self.core = core
        TokenStreams.__init__(
            self,
            detokenizer,
            admit=core.add,
            release=lambda seq: core.wake(),
            max_cached_tokens=core.max_cached_tokens,
            hooks=hooks,
            stream_interval_s=stream_interval_s,
        )
        core.bind(self.deliver, self.fail)

    @property
    def runner(self) -> DecoderRunner | SpeculativeRunner:
        return self.core.runner

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    def start(self) -> None:
        self.core.start()

    async def close(self) -> None:
        await self.core.close()


def _unsent(seq: GenSequence, final: bool) -> str:
    """The text the client may have now: all of it at the end; before that, all but a tail that could be
    the start of a stop string (a stop completed by the next token must never have been half sent)."""
    end = len(seq.text) if final else len(seq.text) - _stop_prefix(seq.text, seq.params.stop)
    delta = seq.text[seq.sent : end]
    seq.sent = max(seq.sent, end)
    return delta


def _stop_prefix(text: str, stops: Sequence[str]) -> int:
    """The length of the longest tail of `text` that some stop string starts with (0: none)."""
    return max(
        (n for stop in stops for n in range(min(len(stop) - 1, len(text)), 0, -1) if text.endswith(stop[:n])),
        default=0,
    )
