"""Distillation-aware serving for encoder tasks: each student answers, and hands its unsure inputs to the
teacher it was distilled from.

A student's manifest names its teacher (`teacher`: name and version) and, when exported as a pair with eval
data, the cascade's calibrated threshold (`cascade`, common.cascade). `Pairs` finds each student's teacher
among the served models once, at start-up. `Pairs.answer` runs a task's own answer function on the student
for all of a request's inputs, then once more on the teacher for the inputs whose confidence (the score of
the student's best answer) is below the threshold: both tiers stay batched in the engine, a request with
several inputs sends only its unsure ones, and every answer carries `model`, the name that gave it. A
teacher that cannot take the unsure inputs (its queue full, its engine away, not done within the cascade's
budget or the request's deadline) leaves the student's answers standing (`from_teacher`): the student has
answered already, and a 429 or a 504 for an answer the service holds helps no client.

Live agreement (service.shadow samples, gates and counts): a share of the inputs the student answered goes
to the teacher too, off the client's path, and whether the two best answers agree is counted per pair. A
generation student's finished answers are checked per token (service.tasks.generation_shadow: does the
teacher's most likely next token equal the one the student wrote), the unit of the next-token agreement its
distillation report gives; an embedding student's vectors by their cosine with the teacher's
(service.tasks.embedding_shadow), the unit of its report's `teacher_cosine`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from service.batch_policy import DeadlineExceededError, QueueFullError
from service.capture import TrafficCapture
from service.exchange import Exchange, TextLimits
from service.ipc import EngineUnavailableError
from service.live_calibration import LEAST, LiveCalibration, LiveCalibrations
from service.manifest import CascadeCalibration, DistillationRecord
from service.metrics import Metrics
from service.registry import ModelNotFoundError, ModelRegistry
from service.served import ServedModel
from service.settings import Settings
from service.shadow import ShadowChecks, ShadowCounters

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - one input of the task (a text, a question/context pair)
R = TypeVar("R")  # one input's answers, best first: dicts with a `score` and a `model`
T = TypeVar("T")  # what a teacher's call returns
AnswerAll = Callable[[ServedModel, Sequence[I], Exchange], Awaitable[list[R]]]
CASCADE_TASKS = frozenset({"text-classification", "question-answering", "fill-mask"})
BUSY_REASONS = ("overloaded", "unavailable", "late")  # why a teacher could not answer (cascade_kept)


def confidence(rows: Any) -> float:
    """The score of the best answer (0 when there is none: the teacher may find one)."""
    return float(rows[0]["score"]) if rows else 0.0


def best_answer(rows: Any) -> dict[str, Any] | None:
    """What two models agree on: the best answer without its scores and who gave it (a label; a span and
    its text; a token)."""
    return {k: v for k, v in rows[0].items() if k not in ("score", "raw_score", "model")} if rows else None


@dataclass(frozen=True)
class Pair:
    """A served student and its served teacher."""

    teacher: ServedModel
    calibrated: float | None  # the manifest's threshold (None: exported without eval data)
    ranking: bool  # a cross-encoder pair: its cascade ranks a query's documents (`rank`), by a margin
    direct: (
        bool  # at the calibrated threshold the cascade costs more than the teacher alone: skip the student
    )
    fallbacks: Any  # distilserve_cascade_fallbacks_total{model, teacher}, resolved once
    inputs: Any  # distilserve_cascade_inputs_total{model}
    shadow: ShadowCounters  # distilserve_shadow_{compared,agreed,dropped}_total{model, teacher}
    kept: dict[str, Any]  # distilserve_cascade_kept_total{model, teacher, reason}, by reason
    live: LiveCalibration | None = None  # DISTILSERVE_CASCADE_CALIBRATION=live: its threshold as it serves


class Pairs:
    """Every served student's teacher, and the threshold each request uses."""

    def __init__(
        self,
        registry: ModelRegistry,
        settings: Settings,
        metrics: Metrics,
        capture: TrafficCapture | None = None,
        calibrations: LiveCalibrations | None = None,
    ) -> None:
        self.settings = settings
        self.capture = capture  # where what a teacher answers is kept (DISTILSERVE_CAPTURE_DIR), or None
        # each pair's live calibration, kept by whoever builds Pairs again when models change
        calibrations = {} if calibrations is None else calibrations
        self.shadows = ShadowChecks(settings)
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
            ranking = model.manifest.cross_encoder
            if ranking and not teacher.manifest.cross_encoder:
                self._unpaired[key] = f"its teacher {ref.name} is not a cross-encoder (one label)"
                continue
            mine, theirs = model.manifest.embedding, teacher.manifest.embedding
            if mine is not None and theirs is not None and mine.dimensions != theirs.dimensions:
                self._unpaired[key] = (
                    f"its teacher {ref.name}'s vectors have {theirs.dimensions} dimensions, its own "
                    f"{mine.dimensions}: not comparable"
                )
                continue
            calibration = model.manifest.cascade
            direct = calibration is not None and calibration.costs_more_than_teacher
            if direct and calibration is not None:
                log.info(
                    "%s v%d: its calibrated cascade sends %.0f%% of inputs to %s, and the student costs "
                    "%.2f of it: more than the teacher alone, which answers directly",
                    model.name,
                    key[1],
                    100 * calibration.fallback_rate,
                    teacher.name,
                    calibration.student_cost,
                )
            live = None
            if calibration is not None and not ranking and model.manifest.task in CASCADE_TASKS:
                gauge = metrics.cascade_threshold.labels(model.name)
                gauge.set(calibration.threshold)
                if settings.cascade_calibration == "live":
                    pair_key = (*key, teacher.name, teacher.manifest.version)
                    live = calibrations.get(pair_key)
                    if live is None:
                        live = calibrations[pair_key] = LiveCalibration(
                            calibration.target_agreement, gauge.set
                        )
                    elif live.current is not None:
                        gauge.set(live.current.threshold)
            self._pairs[key] = Pair(
                teacher,
                calibration.threshold if calibration is not None else None,
                ranking,
                direct,
                metrics.cascade_fallbacks.labels(model.name, teacher.name),
                metrics.cascade_inputs.labels(model.name),
                ShadowCounters(
                    metrics.shadow_compared.labels(model.name, teacher.name),
                    metrics.shadow_agreed.labels(model.name, teacher.name),
                    metrics.shadow_dropped.labels(model.name, teacher.name),
                ),
                {r: metrics.cascade_kept.labels(model.name, teacher.name, r) for r in BUSY_REASONS},
                live,
            )
            record = model.manifest.distillation
            if record is not None and record.student_ahead and model.manifest.task in CASCADE_TASKS:
                log.warning(
                    "%s v%d scored %s on its distillation eval, its teacher %s %s: the cascade gives the "
                    "teacher's answers, at a cost in quality (DISTILSERVE_CASCADE=off keeps the student's)",
                    model.name,
                    key[1],
                    record.student.score,
                    teacher.name,
                    record.teacher.score,
                )
            reference = _live_reference(model, record, calibration)
            if reference is not None:  # what the drift alert holds live agreement to
                metrics.distillation_agreement.labels(model.name, teacher.name).set(reference)

    def pair_of(self, model: ServedModel) -> Pair | None:
        return self._pairs.get((model.name, model.manifest.version))

    def threshold(self, pair: Pair, requested: float | None) -> float | None:
        """The request's own threshold, else the setting's, else the calibrated one (live, once it has seen
        enough, else the export's); None: student only. A ranking pair's inputs go to the teacher by a
        request's own threshold only (its calibration is a margin between documents, `margin`)."""
        if pair.ranking:
            return requested
        live = self._live(pair, requested)
        found = live.threshold() if live is not None else None
        return found if found is not None else self._chosen(pair, requested, self.settings.cascade_threshold)

    def _live(self, pair: Pair, requested: float | None) -> LiveCalibration | None:
        """The pair's live calibration where this request uses the default threshold, else None."""
        default = (
            requested is None and self.settings.cascade == "on" and self.settings.cascade_threshold is None
        )
        return pair.live if default else None

    def teacher_directly(self, pair: Pair, requested: float | None) -> bool:
        """The calibrated threshold applies, and there the teacher alone costs less than the cascade."""
        own = self.settings.cascade_margin if pair.ranking else self.settings.cascade_threshold
        calibrated = requested is None and self.settings.cascade == "on" and own is None
        return calibrated and pair.direct

    def margin(self, pair: Pair, requested: float | None) -> float | None:
        """A ranking pair's margin: the request's own, else the setting's, else the calibrated one; None:
        the student ranks alone."""
        return self._chosen(pair, requested, self.settings.cascade_margin)

    def _chosen(self, pair: Pair, requested: float | None, setting: float | None) -> float | None:
        """A request's own value, else the server's setting, else the pair's calibrated one; None: off."""
        if requested is not None:
            return requested
        if self.settings.cascade == "off":
            return None
        return setting if setting is not None else pair.calibrated

    async def answer(
        self,
        model: ServedModel,
        inputs: Sequence[I],
        answer_all: AnswerAll[I, R],
        requested: float | None,
        x: Exchange,
        budget_ms: float | None = None,
    ) -> list[R]:
        """`answer_all` on the student, then on the teacher for the student's unsure inputs only; a share
        of the student's own answers is checked by the teacher afterwards (shadow). Where the calibrated
        cascade costs more than the teacher alone, the teacher answers everything without the student.
        `budget_ms`: the request's own cascade budget (default: DISTILSERVE_CASCADE_BUDGET_MS)."""
        pair = self.pair_of(model)
        if pair is not None and not pair.ranking and self.teacher_directly(pair, requested):
            pair.inputs.inc(len(inputs))
            teacher = pair.teacher
            directly = await self.from_teacher(
                pair,
                len(inputs),
                lambda: answer_all(teacher, inputs, x),
                x,
                self.budget_from_now(budget_ms),
                budget_ms,
            )
            if directly is not None:
                pair.fallbacks.inc(len(inputs))
                x.answered_by = (pair.teacher.name,)
                if self.capture is not None:
                    self.capture.keep(model, pair.teacher, "teacher", inputs, directly, None)
                return directly
            pair = None  # the teacher could not take them: the student answers, as if unpaired
        began = time.monotonic()
        with self.shadows.serving():
            results = await answer_all(model, inputs, x)
        if pair is None:
            x.answered_by = (model.name,)
            return results
        threshold = self.threshold(pair, requested)
        unsure = [] if threshold is None else [i for i, r in enumerate(results) if confidence(r) < threshold]
        if threshold is not None:
            pair.inputs.inc(len(inputs))
        live = self._live(pair, requested)
        if live is not None:
            live.answered(len(inputs) - len(unsure))
        kept: list[int] = []  # unsure, but the teacher could not take them: the student's answers stand
        if unsure:
            asked, teacher = [inputs[i] for i in unsure], pair.teacher
            answers = await self.from_teacher(
                pair, len(unsure), lambda: answer_all(teacher, asked, x), x, began, budget_ms
            )
            if answers is None:
                kept, unsure = unsure, []
            else:
                pair.fallbacks.inc(len(unsure))
                if self.capture is not None and not pair.ranking:
                    own = [results[i] for i in unsure]
                    self.capture.keep(model, teacher, "cascade", asked, answers, own)
                for i, rows in zip(unsure, answers, strict=True):
                    if live is not None:
                        live.sent(confidence(results[i]), best_answer(results[i]) == best_answer(rows))
                    results[i] = rows
        sure = len(unsure) + len(kept) < len(inputs)
        if not unsure:
            x.answered_by = (model.name,)
        else:
            x.answered_by = (model.name, pair.teacher.name) if sure else (pair.teacher.name,)
        if sure and self.settings.shadow_rate > 0:
            taken = set(unsure) | set(kept)
            mine_at = [i for i in range(len(inputs)) if i not in taken]
            mine = [results[i] for i in mine_at]
            self._shadow(model, pair, [inputs[i] for i in mine_at], mine, answer_all, x.limits, live)
        return results

    def budget_from_now(self, budget_ms: float | None = None) -> float | None:
        """Where a teacher answers directly: its budget (the request's `budget_ms`, else the setting)
        counts from now, and past it the student answers (None without a budget: the request's deadline
        passes as the 504 it is)."""
        chosen = budget_ms if budget_ms is not None else self.settings.cascade_budget_ms
        return time.monotonic() if chosen is not None else None

    async def from_teacher(
        self,
        pair: Pair,
        inputs: int,
        call: Callable[[], Awaitable[T]],
        x: Exchange,
        began: float | None = None,
        budget_ms: float | None = None,
    ) -> T | None:
        """`call`'s answers from the pair's teacher, or None where it could not take `inputs` and the
        student's answers stand, or the student answers instead (DISTILSERVE_CASCADE_OVERLOAD=student): its
        queue full, its engine away, or, given when the request's engine work began (`began`,
        time.monotonic()), past the request's deadline or DISTILSERVE_CASCADE_BUDGET_MS from then. The
        budget is when the teacher's rows must have started: a request that spent it queued for its student
        skips the teacher (under load the teacher's cores then go to the student), rows still queued then
        are dropped before compute, and a call whose rows have all begun is waited for. Counted per reason,
        and in the exchange (X-Distilserve-Teacher-Busy). `budget_ms`: the request's own, else the
        setting's."""
        if budget_ms is None:
            budget_ms = self.settings.cascade_budget_ms
        late = began is not None
        if began is not None and budget_ms is not None:
            x.start_by_s = began + budget_ms / 1000.0
        try:
            if x.start_by_s is not None and time.monotonic() >= x.start_by_s:
                raise DeadlineExceededError(
                    f"the cascade's budget of {budget_ms:g} ms (cascade_budget_ms, or "
                    f"DISTILSERVE_CASCADE_BUDGET_MS) was spent before the teacher {pair.teacher.name} "
                    "could start"
                )
            return await call()
        except (QueueFullError, EngineUnavailableError, DeadlineExceededError) as e:
            reason = busy_reason(e)
            if self.settings.cascade_overload == "refuse" or (reason == "late" and not late):
                raise
        finally:
            x.start_by_s = None
        pair.kept[reason].inc(inputs)
        x.teacher_busy += inputs
        return None

    def _shadow(
        self,
        model: ServedModel,
        pair: Pair,
        inputs: Sequence[I],
        mine: list[R],
        answer_all: AnswerAll[I, R],
        limits: TextLimits,
        live: LiveCalibration | None = None,
    ) -> None:
        """Check a sampled share of the student's answers with the teacher, off the client's path; each
        check also feeds the pair's live calibration (`live`) where the request used its default."""
        picked = [i for i in range(len(inputs)) if self.shadows.sampled()]
        if not picked:
            return

        async def check() -> tuple[int, int]:
            asked = [inputs[i] for i in picked]
            theirs = await answer_all(pair.teacher, asked, Exchange(limits=limits, shadow=True))
            if self.capture is not None and not pair.ranking:
                self.capture.keep(model, pair.teacher, "shadow", asked, theirs, [mine[i] for i in picked])
            agreed = [best_answer(mine[i]) == best_answer(t) for i, t in zip(picked, theirs, strict=True)]
            if live is not None:
                for i, same in zip(picked, agreed, strict=True):
                    live.checked(confidence(mine[i]), same)
            return len(picked), sum(agreed)

        self.shadows.check_later(pair.shadow, len(picked), check)

    def describe(self, model: ServedModel) -> dict[str, Any]:
        """What GET /v1/models says of a model's pairing: its served teacher and the cascade's state."""
        pair = self.pair_of(model)
        calibration = model.manifest.cascade
        if pair is not None and model.manifest.task not in CASCADE_TASKS:  # a teacher, but no cascade
            teacher = {"name": pair.teacher.name, "version": pair.teacher.manifest.version}
            return {"teacher": teacher, "cascade": None}
        if pair is None:
            reason = self._unpaired.get((model.name, model.manifest.version))
            cascade = None if reason is None else {"active": False, "threshold": None, "reason": reason}
            return {"teacher": None, "cascade": cascade}
        threshold = self.margin(pair, None) if pair.ranking else self.threshold(pair, None)
        record = model.manifest.distillation
        return {
            "teacher": {"name": pair.teacher.name, "version": pair.teacher.manifest.version},
            "cascade": {
                "active": threshold is not None,
                "threshold": threshold,
                "teacher_directly": self.teacher_directly(pair, None),
                "student_ahead": record is not None and record.student_ahead,
                "reason": None if threshold is not None else self._why_off(pair),
                "calibration": calibration.model_dump() if calibration is not None else None,
                "live": _live_card(pair),
                "when_teacher_busy": self.settings.cascade_overload,
                "budget_ms": self.settings.cascade_budget_ms,
            },
        }

    def _why_off(self, pair: Pair) -> str:
        if self.settings.cascade == "off":
            return "DISTILSERVE_CASCADE=off"
        if pair.ranking:
            return "exported without eval data: no calibrated margin (set DISTILSERVE_CASCADE_MARGIN)"
        return "exported without eval data: no calibrated threshold (set DISTILSERVE_CASCADE_THRESHOLD)"


def busy_reason(e: Exception) -> str:
    """Why a teacher could not answer, as distilserve_cascade_kept_total says it."""
    if isinstance(e, QueueFullError):
        return "overloaded"
    return "unavailable" if isinstance(e, EngineUnavailableError) else "late"


def _live_reference(
    model: ServedModel, record: DistillationRecord | None, calibration: CascadeCalibration | None
) -> float | None:
    """The export-time figure a pair's live agreement is held to, in the same unit: a ranking pair's
    calibrated agreement (queries served the teacher's best document), an embedding student's mean cosine
    with its teacher, else the distillation report's agreement."""
    if model.manifest.cross_encoder:
        return None if calibration is None else calibration.agreement
    if record is None:
        return None
    return record.teacher_cosine if model.manifest.embedding is not None else record.agreement


def _live_card(pair: Pair) -> dict[str, Any] | None:
    """What GET /v1/models says of a pair's live calibration: None where it is off."""
    if pair.live is None:
        return None
    found = pair.live.current
    if found is None:
        return {
            "active": False,
            "reason": f"fewer than {LEAST} inputs of each kind seen (the export's serves)",
        }
    return {"active": True, **asdict(found)}
