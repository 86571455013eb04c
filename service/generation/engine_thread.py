"""The generation engine's thread half (`GenerationCore`): admission, scheduling, running steps back to back
and recording each token; what it produced goes out as plain data (`Produced`) to whoever streams it
(service.generation.engine's `TokenStreams` in one process, service.core's frontends across processes).

The thread owns the decode loop (schedule -> execute -> record each token -> next step) and never waits for
the event loop, so the model runs while the loop detokenizes and writes the last step's tokens; when the
loop had to launch every step itself, the engine sat idle for a third of the time. Requests join the running
batch between steps and leave it the step they finish. The scheduler is guarded by one lock: requests are
added from the loop, steps planned on the thread. A joining prompt's first token goes out as soon as its
prefill returns, while the running rows' decode call runs (`_first_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor

from service.generation.grammar import Grammars
from service.generation.runner import DecoderRunner, StepLogprobs, StepResult
from service.generation.sampling import Logprob, SamplingParams
from service.generation.scheduler import Scheduler, StepPlan
from service.generation.sequence import FinishReason
from service.generation.sequence import Sequence as GenSequence
from service.generation.speculative import SpeculativeRunner

log = logging.getLogger(__name__)

# sequence, token, its index, how it ended, its log-probabilities and (its first token only) the prompt's,
# where the request asked
Produced = tuple[GenSequence, int, int, FinishReason | None, Logprob | None, list[Logprob] | None]


class GenerationCore:
    """The engine thread's half: admission, scheduling, running steps, recording tokens (eos, length).

    What it produced goes to `deliver` and what failed to `fail` (given here or bound before `start`), both
    called on the event loop it was started in, one call per step. Nothing here detokenizes or knows of
    clients."""

    def __init__(
        self,
        runner: DecoderRunner | SpeculativeRunner,
        scheduler: Scheduler,
        stop_token_ids: int | Iterable[int] | None,
        executor: Executor,
        deliver: Callable[[list[Produced]], None] | None = None,
        fail: Callable[[list[GenSequence], Exception], None] | None = None,
        on_step: Callable[[StepPlan, StepResult], None] | None = None,
        on_queue: Callable[[int, int], None] | None = None,
        grammars: Grammars | None = None,
    ) -> None:
        self.runner = runner
        self.grammars = grammars  # the decoder's, for sequences whose output follows a grammar
        self.scheduler = scheduler
        self.stop_token_ids = _id_set(stop_token_ids)
        self._executor = executor
        self._deliver = deliver or _unbound
        self._fail = fail or _unbound
        self._on_step = on_step
        self._on_queue = on_queue
        self._lock = threading.Lock()  # guards the scheduler: the loop adds, the engine thread plans
        self._work = threading.Event()  # set when there may be something to do
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: asyncio.Future[None] | None = None
        self._closing = False

    @property
    def max_cached_tokens(self) -> int:
        """What one request's prompt + max_new_tokens must fit in: admission refuses more (a ValueError)."""
        return self.scheduler.config.max_cached_tokens

    def start(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = self._loop.run_in_executor(self._executor, self._run)

    async def close(self) -> None:
        """Take no new requests; finish the running and waiting ones; stop."""
        with self._lock:
            self.scheduler.closed = True
        self._closing = True
        self._work.set()
        if self._thread is not None:
            await self._thread
            self._thread = None

    def bind(
        self,
        deliver: Callable[[list[Produced]], None],
        fail: Callable[[list[GenSequence], Exception], None],
    ) -> None:
        """Where produced tokens and failures go (before `start`)."""
        self._deliver, self._fail = deliver, fail

    def add(self, seq: GenSequence) -> None:
        """Queue a sequence (QueueFullError / BatcherClosedError / ValueError when it cannot be taken)."""
        with self._lock:
            self.scheduler.add(seq)
        self._report_queue()
        self._work.set()

    def wake(self) -> None:
        """A sequence was aborted or stopped outside the thread: drop it at the next step."""
        self._work.set()

    def warm_up(self) -> None:
        """One prefill and one decode step, so no real request pays a first-call cost."""
        seq = GenSequence(prompt=[0, 1, 2, 3], params=SamplingParams(max_new_tokens=2))
        result = self.runner.execute(StepPlan(prefill=[seq], decode=[]))
        seq.output.append(result.tokens[seq.id])
        self.runner.execute(StepPlan(prefill=[], decode=[seq]))

    def _run(self) -> None:
        while True:
            with self._lock:
                self._work.clear()
                plan = self.scheduler.schedule()
            self._report_queue()
            if plan.empty:
                if self._closing and not self.scheduler.has_work:
                    return
                self._work.wait(timeout=0.5)  # a request, an abort or close sets it
                continue
            handed_out: set[int] = set()  # sequences whose first tokens went out before the decode call
            try:
                self._joining(plan.prefill)
                result = self.runner.execute(plan, functools.partial(self._first_tokens, plan, handed_out))
                seqs = [s for s in [*plan.prefill, *plan.decode] if s.id not in handed_out]
                produced = self._produced(seqs, result.tokens, result.more, result.logprobs)
            except Exception as e:  # a failing step fails the sequences in it, never the engine thread
                failed = [*plan.prefill, *plan.decode]
                for seq in failed:
                    seq.aborted = True  # out of the next plan at once
                self._to_loop(self._fail, failed, e)
                continue
            if self._on_step is not None:
                try:
                    self._on_step(plan, result)
                except Exception:  # metrics must never stop generation
                    log.exception("generation step hook failed")
            self._to_loop(self._deliver, produced)

    def _joining(self, joining: Sequence[GenSequence]) -> None:
        """Each joining sequence's stop ids (the model's, unless it ignores eos, and its own), and a matcher
        for one whose output follows a grammar (here, on the engine thread: the first one builds llguidance's
        view of the tokenizer)."""
        for seq in joining:
            model = frozenset() if seq.params.ignore_eos else self.stop_token_ids
            seq.stop_ids = model | frozenset(seq.params.stop_token_ids)
            if seq.params.grammar is not None and seq.grammar is None:
                if self.grammars is None:
                    raise ValueError("this model was loaded without a tokenizer for grammars")
                seq.grammar = self.grammars.start(seq.params.grammar)

    def _first_tokens(
        self, plan: StepPlan, handed_out: set[int], tokens: dict[int, int], logprobs: StepLogprobs
    ) -> None:
        """Prompts' first tokens, out to their clients while the running batch's decode call runs."""
        handed_out.update(tokens)
        self._to_loop(self._deliver, self._produced(plan.prefill, tokens, {}, logprobs))

    def _produced(
        self,
        seqs: Sequence[GenSequence],
        tokens: dict[int, int],
        more: dict[int, list[int]],
        logprobs: StepLogprobs,
    ) -> list[Produced]:
        """What `seqs` got of a step's `tokens` (and `more` after them), each recorded in its sequence; a
        prompt part-way through its prefill has none yet."""
        produced = [
            self._record(s, token, chosen[i] if chosen else None, prompt if i == 0 else None)
            for s in seqs
            if s.id in tokens
            for chosen, prompt in ((logprobs.tokens.get(s.id), logprobs.prompts.get(s.id)),)
            for i, token in enumerate((tokens[s.id], *more.get(s.id, ())))
        ]
        return [p for p in produced if p is not None]

    def _record(
        self, seq: GenSequence, token: int, logprob: Logprob | None, prompt: list[Logprob] | None
    ) -> Produced | None:
        """The token appended for the next step, and whether it ends the sequence (eos, length)."""
        if seq.done:  # left, or stopped by a stop string, while this step ran: its token is nobody's
            return None
        seq.output.append(token)
        if seq.grammar is not None:
            seq.grammar.advance(token)
        finish: FinishReason | None = None
        if token in seq.stop_ids:
            finish = "eos"
        elif len(seq.output) >= seq.params.max_new_tokens:
            finish = "length"
        if finish is not None:
            seq.finish_reason = finish
        return seq, token, len(seq.output) - 1, finish, logprob, prompt

    def _to_loop(self, callback: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(callback, *args)

    def _report_queue(self) -> None:
        if self._on_queue is not None:
            self._on_queue(len(self.scheduler.running), len(self.scheduler.waiting))


def _id_set(ids: int | Iterable[int] | None) -> frozenset[int]:
    """The ids a sequence stops at, given as one id (the single eos of older callers), several, or none."""
    if ids is None:
        return frozenset()
    return frozenset((ids,)) if isinstance(ids, int) else frozenset(ids)


def _unbound(*args: object) -> None:
    raise RuntimeError("the generation core's deliver and fail were never bound")
