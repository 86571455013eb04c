"""The cascade's threshold calibrated on what the pair serves (DISTILSERVE_CASCADE_CALIBRATION=live).

An export calibrates a pair's threshold on its eval split, and the threshold answers for that distribution:
served traffic of another kind (measured: docs/benchmarks.md, "Learning the traffic it serves") had the SST-2
pair send half of it to the teacher while agreeing on 99.85 % where 99 % was asked, dearer than the teacher
alone. The service sees both answers wherever the teacher answers: every input the cascade sends on (its
confidence is below the threshold), and the shadow checks' sample of the rest. Weighted by how likely each
was to be seen (1 for the cascade's, for a shadow check the student-answered inputs per check), they stand for
the traffic, and common.cascade's calibration on them gives the lowest threshold that holds the pair's
target agreement on it. Until `LEAST` inputs of each kind are seen the export's threshold serves.

The window is the latest `WINDOW` of each kind; the threshold is recomputed every `EVERY` new inputs. Each
frontend process calibrates on its own share of the traffic. Only requests at the pair's default threshold
count (a request's own `cascade_threshold` sends what it chose).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from common.cascade import calibrate

WINDOW = 20_000  # inputs of each kind kept
EVERY = 500  # new inputs between recalibrations
LEAST = 200  # inputs of each kind before the live threshold replaces the export's


@dataclass(frozen=True)
class LiveThreshold:
    """What the live calibration found, for GET /v1/models."""

    threshold: float
    agreement: float  # estimated on the window, at the threshold
    fallback_rate: float
    sent_seen: int
    checked_seen: int


class LiveCalibration:
    """One pair's live threshold: fed the inputs whose both answers are known, on the event loop."""

    def __init__(self, target: float, on_change: Callable[[float], None] | None = None) -> None:
        self.target = target
        self._on_change = on_change  # told each new threshold (a gauge)
        self._sent: deque[tuple[float, bool]] = deque(maxlen=WINDOW)  # the cascade's: (confidence, agreed)
        self._checked: deque[tuple[float, bool]] = deque(maxlen=WINDOW)  # shadow checks'
        self._answered = 0  # inputs the student answered at the default threshold (shadow candidates)
        self._checked_total = 0
        self._new = 0
        self.current: LiveThreshold | None = None

    def answered(self, inputs: int) -> None:
        """`inputs` the student kept at the default threshold: what each shadow check stands for."""
        self._answered += inputs

    def sent(self, confidence: float, agreed: bool) -> None:
        """An input the cascade sent to the teacher; `agreed`: the student's own answer was the teacher's."""
        self._sent.append((confidence, agreed))
        self._seen()

    def checked(self, confidence: float, agreed: bool) -> None:
        """A student answer the teacher checked off the client's path."""
        self._checked.append((confidence, agreed))
        self._checked_total += 1
        self._seen()

    def threshold(self) -> float | None:
        """The live threshold, once enough was seen; None: the export's serves."""
        return None if self.current is None else self.current.threshold

    def _seen(self) -> None:
        self._new += 1
        if self._new >= EVERY or (self.current is None and self._ready()):
            self._new = 0
            if self._ready():
                self.current = self._calibrated()
                if self._on_change is not None:
                    self._on_change(self.current.threshold)

    def _ready(self) -> bool:
        return len(self._sent) >= LEAST and len(self._checked) >= LEAST and self._answered > 0

    def _calibrated(self) -> LiveThreshold:
        per_check = max(1.0, self._answered / max(self._checked_total, 1))  # inputs a check stands for
        rows = [*self._sent, *self._checked]
        confidence = np.array([c for c, _ in rows])
        agreed = np.array([a for _, a in rows])
        weights = np.concatenate([np.ones(len(self._sent)), np.full(len(self._checked), per_check)])
        found = calibrate(confidence, agreed, self.target, weights)
        seen = len(self._sent), len(self._checked)
        return LiveThreshold(found.threshold, found.agreement, found.fallback_rate, *seen)
