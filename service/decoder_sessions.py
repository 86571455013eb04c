"""Which sessions serve a decoder, decided at start-up: on all cores or on one (timed), its int4 and fp32
graphs split by rows (timed), and a student's draft variant beside the session it serves."""

from __future__ import annotations

import logging

from service.engine import CUDA, Engine
from service.engine_plan import EngineFactory, EnginePlan
from service.generation.split_engine import split_decoder
from service.generation.tuning import SPLIT_PAYS_S, decode_step_s, fastest_threads
from service.repository import ModelVersion
from service.settings import Settings

log = logging.getLogger(__name__)


def draft_engine(
    version: ModelVersion, settings: Settings, engine_factory: EngineFactory, engine: Engine, plan: EnginePlan
) -> Engine | None:
    """The session of a student's draft variant (export.variants.build_draft), on the threads its served
    variant runs on, where speculative decoding may use it: on a CPU (on a GPU the fp16 it serves drafts),
    unless settings say off or to draft with the served variant, or it does not load."""
    manifest = version.manifest
    drafting = manifest.teacher is not None and settings.speculative != "off"
    if not drafting or settings.speculative_draft == "served" or engine.provider == CUDA:
        return None
    variant = next((name for name, spec in manifest.variants.items() if spec.drafts_only), None)
    if variant is None:
        return None
    try:
        return engine_factory(version, variant, plan.settings(settings))
    except Exception as e:  # a draft that cannot load never keeps its model from serving
        log.warning(
            "%s v%d: its %s variant did not load (%s); the variant it serves drafts instead",
            manifest.name,
            manifest.version,
            variant,
            str(e).splitlines()[0][:200],
        )
        return None


def int4_or_fp32(
    version: ModelVersion, settings: Settings, engine_factory: EngineFactory, int4: Engine, plan: EnginePlan
) -> tuple[Engine, str]:
    """A decoder served in int4 by choice (auto) with its fp32 graph beside: each engine call on the graph
    that runs it faster (service.generation.split_engine), decided by timing both at start-up; the engine,
    and the variant it is named by (int4 where int4 answers any call)."""
    manifest = version.manifest
    if not settings.warmup or "fp32" not in manifest.variants or manifest.generation is None:
        return int4, "int4"
    fp32 = engine_factory(version, "fp32", plan.settings(settings))
    name = f"{manifest.name} v{manifest.version}"
    chosen = split_decoder(int4, fp32, manifest.generation, name, settings.gen_max_batch)
    return chosen, "fp32" if chosen is fp32 else "int4"


def faster_decoder(
    version: ModelVersion,
    variant: str,
    settings: Settings,
    engine_factory: EngineFactory,
    engine: Engine,
    plan: EnginePlan,
) -> tuple[Engine, EnginePlan]:
    """On a CPU, the decoder's session on all cores or on one, whichever runs a busy decode step faster
    (service.generation.tuning); the other is dropped. A model too short to time, or a timing that fails,
    keeps all cores: this only ever chooses, it never stops a start-up."""
    manifest = version.manifest
    assert manifest.generation is not None
    positions = manifest.max_sequence_length
    prompt = min(32, positions // 2)
    steps = min(8, positions - prompt - 2)  # every step's position inside the model's
    if prompt < 1 or steps < 2:
        return engine, plan
    one = EnginePlan(instances=1, threads=1)
    rows = min(16, settings.gen_max_batch)
    layout = manifest.generation
    try:
        all_cores_s = decode_step_s(engine, layout, rows, prompt, steps)
        if all_cores_s >= SPLIT_PAYS_S:  # no second session built and timed: seconds of every start-up
            log.info(
                "%s v%d: a decode step of %d sequences takes %.2f ms on %d thread(s): long enough to split",
                manifest.name,
                manifest.version,
                rows,
                all_cores_s * 1000,
                plan.threads,
            )
            return engine, plan
        candidates = [(plan.threads, engine), (1, engine_factory(version, variant, one.settings(settings)))]
        timed = fastest_threads(candidates, lambda e: decode_step_s(e, layout, rows, prompt, steps))
    except Exception as e:  # a failing timing leaves the default in place
        log.warning(
            "%s v%d: timing the decoder's threads failed (%s); all cores", manifest.name, manifest.version, e
        )
        return engine, plan
    log.info(
        "%s v%d: a decode step of %d sequences takes %s; serving on %d thread(s)",
        manifest.name,
        manifest.version,
        rows,
        ", ".join(f"{t.step_s * 1000:.2f} ms on {t.threads} thread(s)" for t in timed),
        timed[0].threads,
    )
    chosen = dict(candidates)[timed[0].threads]
    return chosen, plan if timed[0].threads == plan.threads else one
