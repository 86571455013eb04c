"""The generation engine: `step()` = schedule -> execute (off the event loop) -> update, while there is work.

Requests join the running batch between steps and leave it the step they finish; each one streams its
tokens through its own queue. Everything here runs on the event loop except the runner's engine calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from service.generation.runner import DecoderRunner, StepResult
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, StepPlan
from service.generation.sequence import Sequence as GenSequence
from service.generation.sequence import TokenEvent


@dataclass(frozen=True)
class EngineHooks:
    """Where the engine reports what it did (metrics); all optional."""

    on_step: Callable[[StepPlan, StepResult], None] | None = None
    on_first_token: Callable[[float], None] | None = None  # seconds since arrival
    on_token: Callable[[float], None] | None = None  # seconds since the previous token
    on_queue: Callable[[int, int], None] | None = None  # running, waiting


class GenerationEngine:
    def __init__(
        self,
        runner: DecoderRunner,
        scheduler: Scheduler,
        decode: Callable[[Sequence[int]], str],
        eos_token_id: int | None,
        executor: Executor,
        hooks: EngineHooks | None = None,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self._decode = decode
        self.eos_token_id = eos_token_id
        self._executor = executor
        self._hooks = hooks or EngineHooks()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # -- public -----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="generation-engine")

    async def close(self) -> None:
        """Take no new requests; finish the running and waiting ones; stop."""
        self.scheduler.closed = True
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
            self._task = None

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> GenSequence:
        """Queue a request (QueueFullError / BatcherClosedError when it cannot be taken)."""
        seq = GenSequence(prompt=list(prompt), params=params)
        self.scheduler.add(seq)
        self._report_queue()
        self._wakeup.set()
        return seq

    async def stream(self, seq: GenSequence) -> AsyncIterator[TokenEvent]:
        """The sequence's events until it finishes; leaving early (client gone) frees its slot."""
        try:
            while True:
                event = await seq.events.get()
                if seq.error is not None:
                    raise seq.error
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if seq.finish_reason is None:
                seq.aborted = True
                self._wakeup.set()

    async def generate(self, prompt: Sequence[int], params: SamplingParams) -> tuple[GenSequence, str]:
        """Run to completion; returns the finished sequence and its text."""
        seq = self.submit(prompt, params)
        parts = [event.text async for event in self.stream(seq)]
        return seq, "".join(parts)

    # -- the loop ---------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Schedule, execute, update. The next step is launched as soon as this one's tokens are known, and
        only then are they detokenized and streamed: that work overlaps the engine's, instead of leaving it
        idle for a third of every step."""
        running: tuple[StepPlan, asyncio.Future[StepResult]] | None = None
        while True:
            if running is None:
                if not self.scheduler.has_work:
                    if self._closing:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                running = self._launch()
                if running is None:
                    continue
            plan, step = running
            try:
                result = await step
            except Exception as e:  # a failing step fails the sequences in it, never the engine
                self._fail([*plan.prefill, *plan.decode], e)
                running = None
                continue
            # A sequence that finished (a stop string) or left while this step ran: its token is dropped.
            stepped = [seq for seq in [*plan.prefill, *plan.decode] if not seq.done]
            for seq in stepped:
                self._record(seq, result.tokens[seq.id])
            running = self._launch() if self.scheduler.has_work else None
            if self._hooks.on_step is not None:
                self._hooks.on_step(plan, result)
            for seq in stepped:
                self._emit(seq, result.tokens[seq.id])
            self._report_queue()

    def _launch(self) -> tuple[StepPlan, asyncio.Future[StepResult]] | None:
        """The next step on the executor (finished sequences leave first), or None when nothing runs."""
        plan = self.scheduler.schedule()
        self._report_queue()
        if plan.empty:
            return None
        step = asyncio.get_running_loop().run_in_executor(self._executor, self.runner.execute, plan)
        return plan, step

    def _record(self, seq: GenSequence, token: int) -> None:
        """What the next step needs: the token appended, and whether the sequence ends by eos or length."""
        seq.output.append(token)
        if token == self.eos_token_id and not seq.params.ignore_eos:
            seq.finish_reason = "eos"
        elif len(seq.output) >= seq.params.max_new_tokens:
            seq.finish_reason = "length"

    def _emit(self, seq: GenSequence, token: int) -> None:
        """What the client sees: timing metrics, the text the token completes (a stop string ends it)."""
        now = time.perf_counter()
        if seq.last_token_at is None:
            if self._hooks.on_first_token is not None:
                self._hooks.on_first_token(now - seq.arrived_at)
        elif self._hooks.on_token is not None:
            self._hooks.on_token(now - seq.last_token_at)
        seq.last_token_at = now
        if seq.finish_reason == "eos":
            seq.events.put_nowait(TokenEvent(token, "", "eos"))
            return
        delta, stopped = self._new_text(seq)
        if stopped:
            seq.finish_reason = "stop"
        seq.events.put_nowait(TokenEvent(token, delta, seq.finish_reason))

    def _new_text(self, seq: GenSequence) -> tuple[str, bool]:
        """The text this token completes (held back mid-character), cut at the first stop string."""
        full = self._decode(seq.output)
        for stop in seq.params.stop:
            at = full.find(stop, max(0, len(seq.text) - len(stop) + 1))
            if at != -1:
                delta = full[:at][len(seq.text) :]
                seq.text = full[:at]
                return delta, True
        if full.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the rest
            return "", False
        delta = full[len(seq.text) :]
        seq.text = full
        return delta, False

    def _fail(self, seqs: list[GenSequence], error: Exception) -> None:
        for seq in seqs:
            seq.error = error
            seq.aborted = True
            seq.events.put_nowait(TokenEvent(None, "", None))

    def _report_queue(self) -> None:
        if self._hooks.on_queue is not None:
            self._hooks.on_queue(len(self.scheduler.running), len(self.scheduler.waiting))
