"""One generation request as the engine sees it: prompt, output so far, its RNG and its stream of events.

Its keys and values live in the runner, with the rest of the running batch."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from service.generation.grammar import GrammarState
from service.generation.sampling import Logprob, SamplingParams

FinishReason = Literal["length", "eos", "stop"]
TRACED_TOKENS = 32  # a traced sequence's tokens whose arrival times it keeps (its decode span's events)
_ids = itertools.count()


class Detokenizer(Protocol):
    def step(self, token_id: int) -> str | None:
        """The text this token completes, or None while it ends mid-character."""


@dataclass(frozen=True)
class TokenEvent:
    """What a client sees per step: the new token, the text it completes, and how the sequence ended."""

    token_id: int | None
    text: str
    finish_reason: FinishReason | None = None
    index: int = 0  # which generated token this is (0: the first)
    logprob: Logprob | None = None  # where the request asked (SamplingParams.logprobs)
    prompt_logprobs: list[Logprob] | None = None  # the first token's only, where asked (SamplingParams)


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    aborted: bool = False  # the client went away: free the slot at the next step
    error: Exception | None = None  # the engine failed on a step this sequence was in
    text: str = ""  # detokenized output so far (up to the last complete character, cut at a stop string)
    sent: int = 0  # characters of `text` handed to the client (a possible stop string's start waits)
    streamed: int = 0  # tokens handed to the client: `output` may already hold the engine's next ones
    ended: bool = False  # the client got its last event (the event loop's view; finish_reason is shared)
    arrived_at: float = field(default_factory=time.perf_counter)
    last_token_at: float | None = None
    # a sampled request's: when each of its first TRACED_TOKENS tokens reached its stream (None: not traced)
    token_times: list[float] | None = None
    cached_tokens: int = 0  # of its prompt, read from the answering model's prefix cache (usage details)
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    rng: np.random.Generator | None = None
    detokenizer: Detokenizer | None = None  # set by the engine that streams it
    grammar: GrammarState | None = None  # where params.grammar is set: the engine core's matcher
    stop_ids: frozenset[int] = frozenset()  # the ids that end it, set by the engine core when it joins

    @property
    def constrained(self) -> bool:
        """Whether some tokens may not come next: a grammar, or stop tokens held back by min_tokens."""
        return self.grammar is not None or self.params.min_tokens > 0

    def allowed(self, columns: int, ahead: int = 0) -> np.ndarray | None:
        """The tokens that may come next (None: any), `ahead` drafted tokens past its output (its grammar
        already advanced past them): its grammar's, less its stop ids while min_tokens are not out."""
        mask = None if self.grammar is None else self.grammar.allowed(columns)
        if len(self.output) + ahead < self.params.min_tokens and self.stop_ids:
            mask = np.ones(columns, dtype=bool) if mask is None else mask
            held = [t for t in self.stop_ids if t < columns]
            mask[held] = False
            if not mask.any():  # a grammar that can only end: ending beats looping
                mask[held] = True
        return mask

    def __post_init__(self) -> None:
        if not self.params.greedy:
            self.rng = np.random.default_rng(self.params.seed)

    @property
    def length(self) -> int:
        """Tokens in the KV cache once this step's token is fed: prompt plus output so far."""
        return len(self.prompt) + len(self.output)

    @property
    def capacity(self) -> int:
        """Positions this sequence may occupy in all: what admission reserves for it."""
        return len(self.prompt) + self.params.max_new_tokens

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.aborted
