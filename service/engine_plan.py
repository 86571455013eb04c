"""How a model version is run: on how many threads, how many calls at once, and the factory that opens its
session (the engine core's planning, before any session exists)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.engine import CUDA, Engine, available_cores
from service.repository import ModelVersion
from service.settings import Settings

# The real / padded token share a batch keeps unless configured. On a CPU a padded token costs what a real
# one does and a bigger batch gains nothing, so the floor is high: MiniLM-shaped at 64 clients, 3 alternating
# rounds, 0.85 -> 284 / 291 / 292 req/s (mean batch 15), 0.95 -> 301 / 309 / 308 (mean batch 8.6); the
# demo student 883 / 934 / 937 vs 862 / 939 / 951. On a GPU a bigger batch is nearly free: unchanged there.
CPU_PADDING_FLOOR = 0.95
GPU_PADDING_FLOOR = 0.85


def padding_floor(settings: Settings, provider: str) -> float:
    if settings.min_padding_efficiency is not None:
        return settings.min_padding_efficiency
    return GPU_PADDING_FLOOR if provider == CUDA else CPU_PADDING_FLOOR


EngineFactory = Callable[[ModelVersion, str, Settings], Engine]


@dataclass(frozen=True)
class EnginePlan:
    """How many engine calls a model runs at once (all on its one session) and on how many threads each."""

    instances: int
    threads: int

    def settings(self, settings: Settings) -> Settings:
        """The settings an engine factory gets: the resolved thread count in place of `0 = auto`."""
        return settings.model_copy(update={"intra_op_threads": self.threads})


def engine_plan(
    settings: Settings, *, on_gpu: bool, generation: bool, cores: int | None = None
) -> EnginePlan:
    """On a CPU, one single-threaded call per core beats one call spread over every core: a parallel op waits
    for its slowest thread, and beside the event loop one of them is always late. ONNX Runtime alone, 2
    cores, batch 8, sequences/s: MiniLM-shaped 1 call x 2 threads 296-343 vs 2 calls x 1 thread 362-409;
    the demo student 1,457-1,670 vs 1,947-2,041. The price: a lone batch-1 call runs on one thread (MiniLM-
    shaped 6.2 vs 4.5 ms). A GPU runs one call at a time anyway; a decode loop is one call at a time (on a CPU
    on all cores or on one, as measured at start-up: `service.decoder_sessions.faster_decoder`)."""
    cores = cores or available_cores()  # the engine core owns the device's cores
    if generation:
        instances = 1
    elif settings.instances:
        instances = settings.instances
    else:
        instances = 1 if on_gpu else cores
    return EnginePlan(instances, settings.intra_op_threads or max(1, cores // instances))
