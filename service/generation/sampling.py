"""Choosing the next token from logits: the request's logit bias and penalties (repetition, presence,
frequency), then greedy or temperature, top-k, top-p, seeded; and the chosen token's log-probability with the
most likely alternatives, for requests that ask (`logprobs`).

Pure numpy, one sequence at a time (the logits row of one sequence); each sequence owns its generator so a
seeded request gives the same text whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Below this temperature sampling is greedy (as in vLLM's sampler): a token would need a logit within ~1e-4
# of the best one to keep any weight, at the edge of what float32 logits resolve; and 1/temperature stays
# <= 1e5, so scaled scores stay finite in float32 (see PENALIZED_LIMIT).
GREEDY_BELOW = 1e-5
# Penalised scores are clipped to +-this: 1e30 / 1e-5 is still far inside float32's range (3.4e38), so no
# allowed penalty (down to the smallest positive double) and temperature can make inf or NaN.
PENALIZED_LIMIT = 1e30
# Smaller penalties give the same float32 scores (beyond the limit, or 0), but would overflow float64 first.
_SMALLEST_PENALTY = 1e-200
MAX_LOGPROBS = 20  # alternatives a request may ask for per token (OpenAI's chat limit)

# A token's log-probability and the `logprobs` most likely tokens' (id, log-probability), most likely first:
# plain data, as it travels from the engine core to a frontend.
Logprob = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 (or below GREEDY_BELOW): greedy
    top_k: int = 0  # 0: no cut
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the prompt or the output
    presence_penalty: float = 0.0  # OpenAI's: taken once from the logit of every token the output holds
    frequency_penalty: float = 0.0  # OpenAI's: taken from a token's logit once per time the output holds it
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI's: (token id, added to its logit); -100 bans
    grammar: str | None = None  # llguidance grammar text the output must follow (service.generation.grammar)
    min_tokens: int = 0  # vLLM's: no stop token (the model's or stop_token_ids) and no stop string before
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: these end the output too, besides the model's own
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False  # generate max_new_tokens whatever the model says (fixed-length benchmarks)
    logprobs: int | None = None  # each token's log-probability and this many alternatives' (None: neither)
    prompt_logprobs: int | None = None  # the same for the prompt's tokens after the first (OpenAI's echo)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def shaped(self) -> bool:
        """Whether a bias, a penalty, a grammar or min_tokens changes the logits before a token is chosen."""
        return bool(
            self.repetition_penalty != 1.0
            or self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
            or self.grammar is not None
            or self.min_tokens > 0
        )

    @property
    def argmax(self) -> bool:
        """Whether the next token is the raw logits' argmax (greedy, nothing shaping them): such rows are
        chosen together, by one argmax over the batch."""
        return self.greedy and not self.shaped


def shaped_scores(
    logits: np.ndarray,
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """The logits as the request's sampling sees them (float32, a copy), in vLLM's order: the logit bias
    added, then the repetition penalty over prompt and output, then the presence and frequency penalties over
    the output alone (OpenAI's `logit - frequency * count - presence * (count > 0)`); then every token not
    `allowed` (a grammar's mask, bool) at -inf.

    Only the tokens a bias or a penalty names change, computed in float64 and clipped to +-PENALIZED_LIMIT
    (see `apply_repetition_penalty`); a -inf logit (a cut draft head's unscored token) stays at probability 0.
    """
    scores = logits.astype(np.float32)
    if params.logit_bias:
        ids = np.fromiter((t for t, _ in params.logit_bias), dtype=np.int64)
        bias = np.fromiter((b for _, b in params.logit_bias), dtype=np.float64)
        scores[ids] = np.clip(scores[ids] + bias, -PENALIZED_LIMIT, PENALIZED_LIMIT)
    if params.repetition_penalty != 1.0:
        scores = apply_repetition_penalty(scores, [*prompt, *output], params.repetition_penalty)
    if output and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
        taken = params.frequency_penalty * counts + params.presence_penalty
        scores[ids] = np.clip(scores[ids] - taken, -PENALIZED_LIMIT, PENALIZED_LIMIT)
    if allowed is not None:
        scores[~allowed] = -np.inf
    return scores


def apply_repetition_penalty(logits: np.ndarray, seen: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL's penalty as in HF: positive logits of seen tokens divided by it, negative ones multiplied.

    Only the seen tokens' scores change, so they are computed in float64 and clipped to +-PENALIZED_LIMIT:
    a tiny penalty would otherwise divide them to inf (and the softmax to NaN). Seen tokens pushed past the
    limit tie there, which keeps the penalty's meaning: they outrank every other token.
    """
    if penalty == 1.0 or not seen:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    values = out[ids].astype(np.float64)
    penalty = max(penalty, _SMALLEST_PENALTY)
    penalized = np.where(values > 0, values / penalty, values * penalty)
    out[ids] = np.clip(penalized, -PENALIZED_LIMIT, PENALIZED_LIMIT)
    return out


CANDIDATES = (64, 256)  # how many of the best tokens top-p looks at, widening only when the nucleus is wider


def next_token(
    logits: np.ndarray,
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    rng: np.random.Generator | None,
    allowed: np.ndarray | None = None,
) -> int:
    """The next token id for one sequence, after its `prompt` and `output` so far (what the penalties read),
    among the `allowed` ones where its grammar says (bool over the vocabulary).

    Sampling sorts only what it must: top-k's k best, or for top-p the 64 best, then 256, which nearly
    always hold the nucleus (the whole vocabulary is sorted only when they do not), in float32 where numpy's
    exp is vectorised. Sorting the whole 2,000-token vocabulary in float64 per sequence per step cost 157 us
    with top-p: a batch of 16 spent more on sampling than on the model.
    """
    scores = shaped_scores(logits, params, prompt, output, allowed)
    if params.greedy or rng is None:
        return int(np.argmax(scores))
    scores = scaled(scores, params.temperature)
    vocab = scores.shape[-1]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    weights = np.exp(scores)  # unnormalised probabilities, the best one 1
    if params.top_p >= 1.0:
        best = _best(scores, k) if k < vocab else np.arange(vocab)
        kept = weights[best]
    else:
        total = (
            np.partition(weights, vocab - k)[vocab - k :].sum() if k < vocab else weights.sum()
        )  # top-k first
        for n in (*(c for c in CANDIDATES if c < k), k):
            best = _best(scores, n)
            kept = weights[best] / total
            mass = np.cumsum(kept)
            if mass[-1] >= params.top_p or n == k:  # no token past these can be in the nucleus
                break
        kept = kept[: int(np.searchsorted(mass - kept, params.top_p, side="left"))]  # the best always stays
    cdf = np.cumsum(kept, dtype=np.float64)
    return int(best[min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(kept) - 1)])


def token_logprob(logits: np.ndarray, token: int, alternatives: int) -> Logprob:
    """`token`'s log-probability under the model's own distribution (the log-softmax of its raw logits,
    before penalty, temperature, top-k and top-p: what vLLM reports by default, and what says how sure the
    model was whatever the request's sampling did), and the `alternatives` most likely tokens'."""
    row = logits.astype(np.float32, copy=False)
    top = float(row.max())
    # float32's vectorised exp, summed in float64: 37 us for SmolLM2's 49,152 tokens (111 with 5 or 20
    # alternatives: the partition), where all of it in float64 took 483 (841): a batch of 16 streams pays
    # it 16 times a step. The result is within ~1e-9 of float64's. Only the chosen token and the
    # alternatives become log-probabilities, ranked on the logits themselves (the same order).
    log_total = top + float(np.log(np.exp(row - np.float32(top)).sum(dtype=np.float64)))
    best = _best(row, alternatives) if alternatives > 0 else np.zeros(0, dtype=np.int64)
    return float(row[token]) - log_total, tuple((int(i), float(row[i]) - log_total) for i in best)


def scaled(scores: np.ndarray, temperature: float) -> np.ndarray:
    """Log-probabilities up to a constant: the best score shifted to 0, then divided by the temperature.

    Shifting first keeps every value <= 0, so exp never overflows and the best token's weight is 1 (the
    total is never 0); with scores within +-PENALIZED_LIMIT and temperature >= GREEDY_BELOW the division
    stays finite too.
    """
    return (scores - scores.max()) / np.float32(temperature)


def _best(scores: np.ndarray, n: int) -> np.ndarray:
    """The indices of the n highest scores, highest first (ties: lower index first)."""
    if n >= scores.shape[-1]:
        return np.argsort(-scores, kind="stable")
    top = np.argpartition(-scores, n - 1)[:n]
    return top[np.lexsort((top, -scores[top]))]
