"""Batching driven by a latency target (DISTILSERVE_LATENCY_TARGET_MS): the batch cap and the wait come from
the engine's measured cost, not from fixed settings.

An item's latency is the wait for an engine thread to come free (at worst one batch run, the one ahead of
it) plus its own batch's run; its own time in the queue counts too once work backs up. So:
- each batch's predicted run is kept within RUN_SHARE of the target (the other half: the batch ahead), and
  within what the oldest waiting item has left of it, so that item is answered in time;
- an oldest item already too old to make the target whatever runs (the queue is behind) makes the batch as
  large as the fixed ceilings allow: catching up at the best throughput saves the items behind it;
- a wait for a fuller batch (only under load: the batcher never waits while the engine is idle) is kept
  within the engine call's fixed cost, all a fuller batch can save, and within what the oldest has left.
The cost model is a least-squares fit of run_s = a + b x padded_tokens over the recent batches, times a
slack: a high quantile of observed / predicted runs, so noise in run times is budgeted for.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service.batch_policy import BatchCaps, BatchPolicy, BatchStats

WINDOW = 256  # recent batches the cost model is fitted on
MIN_BATCHES = 8  # before this many, the fixed ceilings apply (and no wait)
REFIT_EVERY = 8  # batches between refits (the fit runs on the event loop)
RUN_SHARE = 0.5  # a batch's predicted run within this share of the target
SLACK_QUANTILE = 0.9  # of observed / predicted run times
MAX_SLACK = 3.0
MIN_WAIT_S = 1e-4  # a shorter wait for a fuller batch gains nothing: none


@dataclass(frozen=True)
class CostModel:
    """Predicted engine run time of one batch: `slack x (fixed_s + per_token_s x padded_tokens)`."""

    fixed_s: float
    per_token_s: float
    slack: float = 1.0

    def run_s(self, padded_tokens: int) -> float:
        return self.slack * (self.fixed_s + self.per_token_s * padded_tokens)

    def tokens_within(self, run_s: float) -> int:
        """The most padded tokens whose predicted run fits in `run_s` (0 when not even an empty one does)."""
        spare = run_s / self.slack - self.fixed_s
        if spare < 0:
            return 0
        if self.per_token_s <= 0:
            return 2**31 - 1
        return int(spare / self.per_token_s)


def fit_cost(tokens: list[int], run_s: list[float]) -> CostModel:
    """Least squares run_s = a + b x tokens, with a, b >= 0 (a negative intercept or slope is noise: then the
    line goes through the origin, which over-predicts large batches rather than under-predicts them)."""
    n = len(tokens)
    if n == 0:
        raise ValueError("no batches to fit")
    mean_x = sum(tokens) / n
    mean_y = sum(run_s) / n
    sxx = sum((x - mean_x) ** 2 for x in tokens)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(tokens, run_s, strict=True))
    if sxx > 0 and sxy > 0:
        b = sxy / sxx
        a = mean_y - b * mean_x
        if a >= 0:
            return CostModel(a, b)
    if mean_x <= 0:
        return CostModel(mean_y, 0.0)
    # One batch shape only, or a negative intercept: proportional to tokens.
    through_origin = sum(x * y for x, y in zip(tokens, run_s, strict=True)) / sum(x * x for x in tokens)
    return CostModel(0.0, max(0.0, through_origin))


def slack_of(
    model: CostModel, tokens: list[int], run_s: list[float], quantile: float = SLACK_QUANTILE
) -> float:
    """How much longer than predicted runs take, at `quantile` of the recent batches (at least 1)."""
    ratios = sorted(y / p for x, y in zip(tokens, run_s, strict=True) if (p := model.run_s(x)) > 0)
    if not ratios:
        return 1.0
    at = ratios[min(len(ratios) - 1, math.ceil(quantile * len(ratios)) - 1)]
    return min(MAX_SLACK, max(1.0, at))


class LatencyTarget:
    """The batcher's planner for one model: learns the engine's cost from each batch (`observe`, on the
    event loop) and caps the next batch from it (`caps`, on an engine thread under the batcher's lock)."""

    def __init__(self, target_s: float, on_fit: Callable[[CostModel, int], None] | None = None) -> None:
        """`on_fit`: handed each new cost model and the padded tokens it lets a batch carry when nothing
        is late (`planned_tokens`): what an operator reads to see the planner's choices (metrics)."""
        if target_s <= 0:
            raise ValueError(f"the latency target must be positive, got {target_s}")
        self.target_s = target_s
        self._on_fit = on_fit
        self._tokens: deque[int] = deque(maxlen=WINDOW)
        self._run_s: deque[float] = deque(maxlen=WINDOW)
        self._since_fit = 0
        self.model: CostModel | None = None  # replaced whole: engine threads read it without a lock

    def observe(self, stats: BatchStats) -> None:
        if stats.failed:
            return  # a failing call's time says nothing of the engine's cost
        self._tokens.append(stats.padded_tokens)
        self._run_s.append(stats.run_s)
        self._since_fit += 1
        if len(self._tokens) >= MIN_BATCHES and (self.model is None or self._since_fit >= REFIT_EVERY):
            tokens, run_s = list(self._tokens), list(self._run_s)
            line = fit_cost(tokens, run_s)
            self.model = CostModel(line.fixed_s, line.per_token_s, slack_of(line, tokens, run_s))
            self._since_fit = 0
            if self._on_fit is not None:
                self._on_fit(self.model, self.planned_tokens(self.model))

    def planned_tokens(self, model: CostModel) -> int:
        """The padded tokens a batch may carry when its oldest item is fresh: a run of RUN_SHARE of the
        target (the most any batch gets, short of catching up)."""
        return model.tokens_within(RUN_SHARE * self.target_s)

    def caps(self, policy: BatchPolicy, oldest_age_s: float, oldest_cost: int) -> BatchCaps:
        """Caps for the batch the oldest queued item (waiting `oldest_age_s`, `oldest_cost` tokens) leads;
        the policy's size and token caps stay ceilings (memory, warmed-up shapes)."""
        model = self.model
        ceiling = BatchCaps(policy.max_batch_size, policy.max_batch_tokens, 0.0)
        if model is None:
            return ceiling
        left = self.target_s - oldest_age_s
        if model.run_s(oldest_cost) > left:
            return ceiling  # late whatever runs: catch up
        run_budget = min(left, RUN_SHARE * self.target_s)
        tokens = min(policy.max_batch_tokens, max(oldest_cost, model.tokens_within(run_budget)))
        size = max(1, min(policy.max_batch_size, tokens // oldest_cost))
        wait = min(model.fixed_s, left - model.run_s(tokens))
        return BatchCaps(size, tokens, wait if wait >= MIN_WAIT_S else 0.0)


def planner_for(
    target_ms: float | None, on_fit: Callable[[CostModel, int], None] | None = None
) -> LatencyTarget | None:
    """A model's planner for DISTILSERVE_LATENCY_TARGET_MS; unset: none, the fixed settings batch as ever."""
    return None if target_ms is None else LatencyTarget(target_ms / 1000, on_fit)
