"""The cascade's calibration: the lowest confidence threshold at which student-then-teacher answers agree
with the teacher alone on a target share of inputs. Pure numpy: export calibrates with it, tests check it.

A cascade answers an input with the student when the student's confidence (the score of its best answer:
the top label's probability, the best span's, the top token's) is at least the threshold, else with the
teacher. An input the teacher answers agrees with the teacher by definition, so the cascade's agreement at
threshold t is 1 - (student answers at or above t that disagree) / N. Raising t sends more inputs to the
teacher and never lowers agreement; the calibrated threshold is the lowest that reaches the target, so the
fewest inputs reach the teacher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Scores = Sequence[float] | np.ndarray
Flags = Sequence[bool] | np.ndarray


@dataclass(frozen=True)
class Calibration:
    """What a threshold does on the calibration inputs."""

    threshold: float  # answer with the student when its confidence >= threshold
    agreement: float  # the cascade's agreement with the teacher at that threshold
    fallback_rate: float  # the share of inputs sent to the teacher
    student_agreement: float  # the student alone
    examples: int


def _arrays(confidence: Scores, agrees: Flags) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(confidence, dtype=np.float64)
    a = np.asarray(agrees, dtype=bool)
    if c.shape != a.shape or c.ndim != 1 or c.size == 0:
        raise ValueError(f"need as many confidences as agreements, at least one; got {c.shape}, {a.shape}")
    return c, a


def at_threshold(confidence: Scores, agrees: Flags, threshold: float) -> Calibration:
    """The cascade's agreement and fallback rate at `threshold` on these inputs."""
    c, a = _arrays(confidence, agrees)
    to_teacher = c < threshold
    disagreeing = int((~a & ~to_teacher).sum())
    return Calibration(
        threshold=float(threshold),
        agreement=1.0 - disagreeing / c.size,
        fallback_rate=float(to_teacher.mean()),
        student_agreement=float(a.mean()),
        examples=int(c.size),
    )


def calibrate(confidence: Scores, agrees: Flags, target: float, weights: Scores | None = None) -> Calibration:
    """The lowest threshold whose cascade agrees with the teacher on at least `target` of the inputs.

    Candidate thresholds are 0 (the student answers everything) and each distinct confidence (everything
    below it goes to the teacher). A target the student alone meets gives 0; when only sending every input
    would meet it, the threshold lies just above the highest confidence seen (the student answers nothing).
    `weights`: how many inputs each one stands for (a sample's inverse inclusion probability: the service's
    live calibration sees every input the cascade sent and a sampled share of the rest); the Calibration's
    shares are then weighted too.
    """
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"the target agreement is a share between 0 and 1, got {target}")
    c, a = _arrays(confidence, agrees)
    w = np.ones_like(c) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != c.shape or not np.all(w > 0):
        raise ValueError(f"need one positive weight per input, got {w.shape} for {c.shape}")
    allowed = (1.0 - target) * w.sum() + 1e-9 * w.sum()  # disagreeing weight the target leaves room for
    values = np.unique(c)
    order = np.argsort(c, kind="stable")
    wrong = np.where(a[order], 0.0, w[order])
    wrong_from = np.append(np.cumsum(wrong[::-1])[::-1], 0.0)  # disagreeing weight among sorted[i:]
    wrong_at = wrong_from[np.searchsorted(c[order], values, side="left")]  # ... among c >= each value
    if wrong.sum() <= allowed:
        threshold = 0.0
    else:
        meeting = np.flatnonzero(wrong_at <= allowed)
        threshold = float(values[meeting[0]]) if meeting.size else float(np.nextafter(values[-1], np.inf))
    return at_threshold(c, a, threshold) if weights is None else _weighted(c, a, w, threshold)


def _weighted(c: np.ndarray, a: np.ndarray, w: np.ndarray, threshold: float) -> Calibration:
    to_teacher = c < threshold
    total = float(w.sum())
    return Calibration(
        threshold=float(threshold),
        agreement=1.0 - float(w[~a & ~to_teacher].sum()) / total,
        fallback_rate=float(w[to_teacher].sum()) / total,
        student_agreement=float(w[a].sum()) / total,
        examples=int(c.size),
    )


def paying_limit(confidence: Scores, agrees: Flags, student_cost: float) -> Calibration | None:
    """The highest threshold at which the cascade still costs less than the teacher alone (each input the
    student's pass, `student_cost` of the teacher's, and the ones sent on the teacher's too): the most
    agreement a cascade that pays reaches on these inputs. None when even sending nothing costs too much."""
    c, a = _arrays(confidence, agrees)
    if student_cost >= 1.0:
        return None
    paying = [t for t in (0.0, *np.unique(c)) if float((c < t).mean()) < 1.0 - student_cost]
    return at_threshold(c, a, max(paying))


# A ranking cascade (a cross-encoder student and its teacher ranking documents for a query). The student
# scores every document; the teacher reads again those whose student score is within `margin` of the
# student's best (when there are at least two: one alone has nothing to be ranked against) and orders them
# first, by its own scores. Its best document is the teacher's alone whenever the teacher's best document is
# among them: the query "agrees". The share sent is of documents, the unit each model pays for.
Group = tuple[Scores, Scores]  # one query's documents: the student's scores, the teacher's


def needed_margins(groups: Sequence[Group]) -> np.ndarray:
    """For each query, how far below the student's best the teacher's best document scores with the
    student: the least margin at which the cascade picks the teacher's best (0 where both pick the same)."""
    return _Ranked.of(groups).needed


@dataclass(frozen=True)
class _Ranked:
    """The queries as flat arrays: each document's gap below its query's best student score."""

    needed: np.ndarray  # per query
    gaps: np.ndarray  # per document
    query: np.ndarray  # per document: its query's index

    @staticmethod
    def of(groups: Sequence[Group]) -> _Ranked:
        needed, gaps, query = [], [], []
        for q, (mine, theirs) in enumerate(groups):
            s, t = np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
            if s.shape != t.shape or s.ndim != 1 or s.size == 0:
                raise ValueError(f"need both models' scores of the same documents, got {s.shape}, {t.shape}")
            needed.append(float(s.max() - s[int(np.argmax(t))]))
            gaps.append(s.max() - s)
            query.append(np.full(s.size, q))
        if not needed:
            raise ValueError("need at least one query with documents to calibrate a ranking cascade on")
        return _Ranked(np.asarray(needed), np.concatenate(gaps), np.concatenate(query))

    def at(self, margin: float) -> Calibration:
        near = np.bincount(self.query[self.gaps <= margin], minlength=self.needed.size)
        return Calibration(
            threshold=float(margin),
            agreement=float((self.needed <= margin).mean()),
            fallback_rate=float(near[near > 1].sum() / self.gaps.size),
            student_agreement=float((self.needed == 0).mean()),
            examples=int(self.needed.size),
        )


def at_margin(groups: Sequence[Group], margin: float) -> Calibration:
    """The ranking cascade's top-1 agreement with the teacher alone, and the share of documents the teacher
    reads, at `margin`."""
    return _Ranked.of(groups).at(margin)


def calibrate_margin(groups: Sequence[Group], target: float) -> Calibration:
    """The least margin at which the cascade's best document is the teacher's for at least `target` of the
    queries: the least each query needs, taken at that share."""
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"the target agreement is a share between 0 and 1, got {target}")
    ranked = _Ranked.of(groups)
    needed = np.sort(ranked.needed)
    keep = int(np.ceil(target * needed.size - 1e-9))  # queries that must agree
    return ranked.at(float(needed[keep - 1]) if keep > 0 else 0.0)


def paying_margin(groups: Sequence[Group], student_cost: float) -> Calibration | None:
    """The widest margin at which the ranking cascade still costs less than the teacher alone (each
    document the student's pass, `student_cost` of the teacher's, and those read again the teacher's):
    the most agreement a ranking cascade that pays reaches. None when the student alone costs too much."""
    if student_cost >= 1.0:
        return None
    ranked = _Ranked.of(groups)
    found = [ranked.at(m) for m in (0.0, *np.unique(ranked.needed))]
    return max((f for f in found if f.fallback_rate < 1.0 - student_cost), key=lambda f: f.threshold)
