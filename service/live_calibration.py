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

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from common.cascade import calibrate

WINDOW = 20_000  # inputs of each kind kept
EVERY = 500  # new inputs between recalibrations
LEAST = 200  # inputs of each kind before the live threshold replaces the export's
BACKGROUND = True  # recalibrate on a thread (off: in the caller, for tests)


@dataclass(frozen=True)
class LiveThreshold:
    """What the live calibration found, for GET /v1/models."""

    threshold: float
    agreement: float  # estimated on the window, at the threshold
    fallback_rate: float
    sent_seen: int
    checked_seen: int


class _Window:
    """The latest WINDOW (confidence, agreed) pairs of one kind, in arrays a snapshot copies at once."""

    def __init__(self) -> None:
        self.confidence = np.zeros(WINDOW)
        self.agreed = np.zeros(WINDOW, dtype=bool)
        self.count = 0  # ever added

    def add(self, confidence: float, agreed: bool) -> None:
        at = self.count % WINDOW
        self.confidence[at], self.agreed[at] = confidence, agreed
        self.count += 1

    def __len__(self) -> int:
        return min(self.count, WINDOW)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        return self.confidence[:n].copy(), self.agreed[:n].copy()


class LiveCalibration:
    """One pair's live threshold: fed on the event loop the inputs whose both answers are known; each
    recalibration runs on a thread of its own over a snapshot (~10 ms for 40,000 inputs on 2 cores, which
    the loop would otherwise stall for), and its result replaces `current` when done; inputs that arrive
    meanwhile count towards the next. `background=False` (or the module's BACKGROUND) calibrates in the
    caller instead: tests."""

    def __init__(
        self, target: float, on_change: Callable[[float], None] | None = None, background: bool | None = None
    ) -> None:
        self.target = target
        self._on_change = on_change  # told each new threshold (a gauge)
        self._background = BACKGROUND if background is None else background
        self._sent = _Window()  # the cascade's: every input it sent on
        self._checked = _Window()  # the shadow checks'
        self._answered = 0  # inputs the student answered at the default threshold (shadow candidates)
        self._new = 0
        self._running: threading.Thread | None = None
        self.current: LiveThreshold | None = None

    def answered(self, inputs: int) -> None:
        """`inputs` the student kept at the default threshold: what each shadow check stands for."""
        self._answered += inputs

    def sent(self, confidence: float, agreed: bool) -> None:
        """An input the cascade sent to the teacher; `agreed`: the student's own answer was the teacher's."""
        self._sent.add(confidence, agreed)
        self._seen()

    def checked(self, confidence: float, agreed: bool) -> None:
        """A student answer the teacher checked off the client's path."""
        self._checked.add(confidence, agreed)
        self._seen()

    def threshold(self) -> float | None:
        """The live threshold, once enough was seen; None: the export's serves."""
        return None if self.current is None else self.current.threshold

    def _seen(self) -> None:
        self._new += 1
        due = self._new >= EVERY or (self.current is None and self._ready())
        if not due or not self._ready() or (self._running is not None and self._running.is_alive()):
            return
        self._new = 0
        per_check = max(1.0, self._answered / max(self._checked.count, 1))  # inputs a check stands for
        job = (*self._sent.snapshot(), *self._checked.snapshot(), per_check)
        if not self._background:
            self._calibrate(*job)
            return
        self._running = threading.Thread(
            target=self._calibrate, args=job, name="live-calibration", daemon=True
        )
        self._running.start()

    def _ready(self) -> bool:
        return len(self._sent) >= LEAST and len(self._checked) >= LEAST and self._answered > 0

    def _calibrate(
        self,
        sent_c: np.ndarray,
        sent_a: np.ndarray,
        checked_c: np.ndarray,
        checked_a: np.ndarray,
        per_check: float,
    ) -> None:
        weights = np.concatenate([np.ones(sent_c.size), np.full(checked_c.size, per_check)])
        found = calibrate(
            np.concatenate([sent_c, checked_c]), np.concatenate([sent_a, checked_a]), self.target, weights
        )
        self.current = LiveThreshold(
            found.threshold, found.agreement, found.fallback_rate, sent_c.size, checked_c.size
        )
        if self._on_change is not None:
            self._on_change(found.threshold)


LiveCalibrations = dict[tuple[str, int, str, int], LiveCalibration]  # (student, version, teacher, version)
