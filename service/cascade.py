"""Distillation-aware serving for encoder tasks: each student answers, and hands its unsure inputs to the
teacher it was distilled from.

A student's manifest names its teacher (`teacher`: name and version) and, when exported as a pair with eval
data, the cascade's calibrated threshold (`cascade`, common.cascade). `Pairs` finds each student's teacher
among the served models once, at start-up. `Pairs.answer` runs a task's own answer function on the student
for all of a request's inputs, then once more on the teacher for the inputs whose confidence (the score of
the student's best answer) is below the threshold: both tiers stay batched in the engine, a request with
several inputs sends only its unsure ones, and every answer carries `model`, the name that gave it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from service.exchange import Exchange
from service.metrics import Metrics
from service.registry import ModelNotFoundError, ModelRegistry
from service.served import ServedModel
from service.settings import Settings

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - one input of the task (a text, a question/context pair)
R = TypeVar("R")  # one input's answers, best first: dicts with a `score` and a `model`
AnswerAll = Callable[[ServedModel, Sequence[I]], Awaitable[list[R]]]


def confidence(rows: Any) -> float:
    """The score of the best answer (0 when there is none: the teacher may find one)."""
    return float(rows[0]["score"]) if rows else 0.0


@dataclass(frozen=True)
class Pair:
    """A served student and its served teacher."""

    teacher: ServedModel
    calibrated: float | None  # the manifest's threshold (None: exported without eval data)
    fallbacks: Any  # distilserve_cascade_fallbacks_total{model, teacher}, resolved once
    inputs: Any  # distilserve_cascade_inputs_total{model}


class Pairs:
    """Every served student's teacher, and the threshold each request uses."""

    def __init__(self, registry: ModelRegistry, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self._pairs: dict[tuple[str, int], Pair] = {}
        self._unpaired: dict[tuple[str, int], str] = {}  # a named teacher that is not served, and why
        for model in registry.all():
            ref = model.manifest.teacher
            if ref is None:
                continue
            key = (model.name, model.manifest.version)
            try:
                teacher = registry.get(ref.name, ref.version)
            except ModelNotFoundError as e:
                self._unpaired[key] = f"its teacher is not served: {e}"
                log.warning("%s v%d: %s; it answers alone", model.name, key[1], self._unpaired[key])
                continue
            if teacher.manifest.task != model.manifest.task:
                self._unpaired[key] = f"its teacher {ref.name} serves {teacher.manifest.task}"
                continue
            calibration = model.manifest.cascade
            self._pairs[key] = Pair(
                teacher,
                calibration.threshold if calibration is not None else None,
                metrics.cascade_fallbacks.labels(model.name, teacher.name),
                metrics.cascade_inputs.labels(model.name),
            )

    def pair_of(self, model: ServedModel) -> Pair | None:
        return self._pairs.get((model.name, model.manifest.version))

    def threshold(self, pair: Pair, requested: float | None) -> float | None:
        """The request's own threshold, else the setting's, else the calibrated one; None: student only."""
        if requested is not None:
            return requested
        if self.settings.cascade == "off":
            return None
        if self.settings.cascade_threshold is not None:
            return self.settings.cascade_threshold
        return pair.calibrated

    async def answer(
        self,
        model: ServedModel,
        inputs: Sequence[I],
        answer_all: AnswerAll[I, R],
        requested: float | None,
        x: Exchange,
    ) -> list[R]:
        """`answer_all` on the student, then on the teacher for the student's unsure inputs only."""
        results = await answer_all(model, inputs)
        pair = self.pair_of(model)
        threshold = None if pair is None else self.threshold(pair, requested)
        if pair is None or threshold is None:
            x.answered_by = (model.name,)
            return results
        unsure = [i for i, rows in enumerate(results) if confidence(rows) < threshold]
        pair.inputs.inc(len(inputs))
        if not unsure:
            x.answered_by = (model.name,)
            return results
        pair.fallbacks.inc(len(unsure))
        answers = await answer_all(pair.teacher, [inputs[i] for i in unsure])
        for i, rows in zip(unsure, answers, strict=True):
            results[i] = rows
        sure = len(unsure) < len(inputs)
        x.answered_by = (model.name, pair.teacher.name) if sure else (pair.teacher.name,)
        return results

    def describe(self, model: ServedModel) -> dict[str, Any]:
        """What GET /v1/models says of a model's pairing: its served teacher and the cascade's state."""
        pair = self.pair_of(model)
        calibration = model.manifest.cascade
        if pair is None:
            reason = self._unpaired.get((model.name, model.manifest.version))
            cascade = None if reason is None else {"active": False, "threshold": None, "reason": reason}
            return {"teacher": None, "cascade": cascade}
        threshold = self.threshold(pair, None)
        return {
            "teacher": {"name": pair.teacher.name, "version": pair.teacher.manifest.version},
            "cascade": {
                "active": threshold is not None,
                "threshold": threshold,
                "reason": None if threshold is not None else self._why_off(),
                "calibration": calibration.model_dump() if calibration is not None else None,
            },
        }

    def _why_off(self) -> str:
        if self.settings.cascade == "off":
            return "DISTILSERVE_CASCADE=off"
        return "exported without eval data: no calibrated threshold (set DISTILSERVE_CASCADE_THRESHOLD)"
