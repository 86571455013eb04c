"""Speculative decoding's wiring: which served teacher drafts with which served student
(service.generation.speculative does the drafting). At start-up and for a teacher version loaded while
serving, `attach_drafts`; for a student version loaded or unloaded while its teacher serves,
`follow_student`."""

from __future__ import annotations

import logging

from common.draft_head import CONTEXT_INPUT, DraftHead
from service.generation.runner import DecoderRunner
from service.generation.speculative import SpeculativeRunner, pays_off
from service.manifest import Manifest
from service.runtime import EngineModel
from service.settings import Settings

log = logging.getLogger(__name__)


def attach_drafts(models: list[EngineModel], settings: Settings, teachers: EngineModel | None = None) -> None:
    """Speculative decoding: each generation teacher served with a student of the same tokenizer gets
    the student as its draft (service.generation.speculative), where settings and step costs say so.
    `teachers`: only this one (a version loaded while serving, before it starts: a teacher already
    decoding keeps its runner, never swapped under its engine thread; `follow_student` changes its draft)."""
    for student in models:
        teacher = _teacher_of(student, models)
        if teacher is None or teacher.generation is None or student.generation is None:
            continue
        if teachers is not None and teacher is not teachers:
            continue
        if isinstance(teacher.generation.runner, SpeculativeRunner):
            continue
        draft = _usable_draft(teacher, student, settings)
        if draft is None:
            continue
        teacher.generation.runner = SpeculativeRunner(
            teacher.generation.runner,
            draft,
            settings.speculative_tokens,
            teacher.manifest.max_sequence_length,
            settings.speculative_max_batch,
            settings.speculative_confidence,
        )
        log.info(
            "speculative decoding: %s v%d (%s) drafts for %s, k=%d (ending a round below %.2f), while at "
            "most %s sequences decode",
            *_named(student),
            "its draft variant"
            + ("" if draft.head is None else f", its head {draft.head.tokens} ids + the context's")
            if draft.engine is student.draft_engine
            else student.variant,
            teacher.name,
            settings.speculative_tokens,
            settings.speculative_confidence,
            settings.speculative_max_batch or "any number of",
        )


def follow_student(
    models: list[EngineModel], student: EngineModel, settings: Settings, gone: bool = False
) -> None:
    """A student version loaded (or, `gone`, unloaded) while its teacher decodes speculatively: the teacher
    drafts with the new version from its next step (with none usable, or the student gone, it decodes
    alone). Timing the draft (auto) blocks: call it off the event loop."""
    teacher = _teacher_of(student, models)
    if teacher is None or teacher.generation is None:
        return
    runner = teacher.generation.runner
    if not isinstance(runner, SpeculativeRunner):
        return
    if gone:
        current = runner.drafting_with
        if current is not None and current.engine is student.engine:
            runner.replace_draft(None)
            log.info("speculative decoding: %s v%d gone, %s decodes alone", *_named(student), teacher.name)
        return
    draft = _usable_draft(teacher, student, settings)
    runner.replace_draft(draft)
    log.info(
        "speculative decoding: %s v%d %s for %s from its next step",
        *_named(student),
        "drafts" if draft is not None else "does not draft",
        teacher.name,
    )


def _teacher_of(student: EngineModel, models: list[EngineModel]) -> EngineModel | None:
    ref = student.manifest.teacher
    if ref is None:
        return None
    return next((m for m in models if (m.name, m.manifest.version) == (ref.name, ref.version)), None)


def _named(model: EngineModel) -> tuple[str, int]:
    return model.name, model.manifest.version


def _usable_draft(teacher: EngineModel, student: EngineModel, settings: Settings) -> DecoderRunner | None:
    """The student as the teacher's draft (its draft variant's session where it has one, else the one it
    serves), unless the tokenizers differ, settings say off, or (auto) a draft step costs too much of a
    teacher's (timed now; a draft variant found so is released: it only ever drafts)."""
    if student.manifest.generation is None or settings.speculative == "off":
        return None
    if teacher.manifest.tokenizer.sha256 != student.manifest.tokenizer.sha256:
        log.info("%s drafts nothing for %s: their tokenizers differ", student.name, teacher.name)
        return None
    head = _checked_head(student)
    engine = student.draft_engine or student.engine
    draft = DecoderRunner(
        engine,
        student.manifest.generation,
        settings.gen_prefill_tokens,
        head,
        prefix_cache_bytes=settings.gen_prefix_cache_mb << 20,
    )
    if settings.speculative == "auto" and not pays_off(teacher.engine, teacher.manifest, draft):
        if engine is student.draft_engine:  # timed and found too slow: it would sit loaded, never run
            student.draft_engine = None
            log.info("%s v%d: its draft variant is released (it does not pay)", *_named(student))
        return None
    return draft


def cut_head(manifest: Manifest) -> DraftHead | None:
    """The draft variant's cut output head (VariantSpec.head_tokens), if it has one."""
    spec = next((v for v in manifest.variants.values() if v.drafts_only), None)
    logits = next((o for o in manifest.outputs if o.name == "logits"), None)
    if spec is None or spec.head_tokens is None or logits is None or not isinstance(logits.shape[-1], int):
        return None
    return DraftHead(spec.head_tokens, logits.shape[-1])


def _checked_head(student: EngineModel) -> DraftHead | None:
    """The draft variant's cut head, where its manifest and its graph agree on one. Where they disagree (a
    hand-edited repository: the graph would be fed or read wrongly) the variant is released and the one
    the student serves drafts instead."""
    if student.draft_engine is None:
        return None
    head = cut_head(student.manifest)
    if (head is not None) == (CONTEXT_INPUT in student.draft_engine.input_names):
        return head
    log.warning(
        "%s v%d: its draft variant's graph %s %s, its manifest %s a cut head (variants.draft.head_tokens); "
        "the variant it serves drafts instead",
        *_named(student),
        "lacks" if head is not None else "takes",
        CONTEXT_INPUT,
        "names" if head is not None else "names no",
    )
    student.draft_engine = None
    return None
