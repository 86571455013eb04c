"""A step's logits turned into what its sequences get: each one's next token (greedy rows by one argmax over
the batch, the others through the sampler), a prompt's first token from the chunk it ends in, and the
log-probabilities a request asked for (of its tokens, and of its prompt's)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from service.generation.sampling import Logprob, next_token, token_logprob
from service.generation.sequence import Sequence


@dataclass
class StepLogprobs:
    """A step's log-probabilities by sequence id, for the sequences that asked: of its new tokens (the
    token, then `more`; SamplingParams.logprobs) and, at its prefill, of its prompt's tokens after the first
    (each under the positions before it; SamplingParams.prompt_logprobs)."""

    tokens: dict[int, list[Logprob]] = field(default_factory=dict)
    prompts: dict[int, list[Logprob]] = field(default_factory=dict)


def prefill_choices(
    seqs: Seq[Sequence],
    logits: np.ndarray,
    start: int,
    end: int,
    lengths: np.ndarray,
    logprobs: StepLogprobs | None,
    gathered: dict[int, list[Logprob]] | None,
    ending: bool = False,
) -> dict[int, int]:
    """From one chunk's `logits` [rows, end - start, vocab]: the first token of each prompt that ends in it
    (its `lengths` columns run), and the log-probabilities of the prompt tokens the chunk predicts, where
    asked (prompts run whole): gathered in `gathered` across chunks, and handed to `logprobs` with the
    first token. `ending`: the logits are [rows, 1, vocab], each row's at its last position in the chunk
    only (`ending_positions`; nothing to gather then)."""
    tokens = {}
    for row, s in enumerate(seqs):
        n = int(lengths[row])
        if gathered is not None and (start == 0 or start < n - 1):  # a 1-token prompt: an empty entry
            # the chunk's positions start, start + 1, ... predict the prompt's tokens start + 1, ...
            predicted = logits[row, : min(end, n - 1) - start]
            add_prompt_logprobs(gathered, s, predicted, first=start + 1)
        if start <= n - 1 < end:
            last = logits[row, 0 if ending else n - 1 - start]
            tokens[s.id] = next_token(last, s.params, s.prompt, (), s.rng, s.allowed(len(last)))
            if logprobs is not None:
                add_logprobs(logprobs.tokens, s, last[None], [tokens[s.id]])
                if gathered is not None and s.id in gathered:
                    logprobs.prompts[s.id] = gathered.pop(s.id)
    return tokens


def add_logprobs(
    logprobs: dict[int, list[Logprob]], seq: Sequence, logits: np.ndarray, tokens: Seq[int]
) -> None:
    """Where `seq` asked for them, the log-probabilities of `tokens`, each under its row of `logits`
    [len(tokens), vocab] (the positions that chose them)."""
    if seq.params.logprobs is not None:
        logprobs[seq.id] = [
            token_logprob(row, token, seq.params.logprobs) for row, token in zip(logits, tokens, strict=True)
        ]


def add_prompt_logprobs(
    logprobs: dict[int, list[Logprob]], seq: Sequence, logits: np.ndarray, first: int = 1
) -> None:
    """Where `seq` asked for them, the log-probabilities of its prompt's tokens from index `first` on (the
    first token has none), each under the prefill's `logits` row at the position before it; a chunked
    prefill adds its chunks in order."""
    if seq.params.prompt_logprobs is not None:
        add = seq.params.prompt_logprobs
        targets = seq.prompt[first : first + len(logits)]
        logprobs.setdefault(seq.id, []).extend(
            token_logprob(row, t, add) for row, t in zip(logits, targets, strict=True)
        )


def next_tokens(logits: np.ndarray, seqs: Seq[Sequence]) -> list[int]:
    """One token per row of `logits` [batch, vocab]: the plain greedy rows (no bias or penalty, most of
    them) from one argmax over the batch, the others through the sampler one by one."""
    best = logits.argmax(axis=-1)
    return [
        int(best[row])
        if s.params.argmax
        else next_token(logits[row], s.params, s.prompt, s.output, s.rng, s.allowed(logits.shape[-1]))
        for row, s in enumerate(seqs)
    ]
