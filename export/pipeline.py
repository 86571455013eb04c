"""One export: HF directory -> ONNX variants -> parity gate -> a new version in the model repository."""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from common.draft_head import CONTEXT_INPUT, HEAD_TOKENS_KEY, DraftHead
from export.calibration import CASCADE_TASKS, calibrate_pair
from export.chat import chat_spec
from export.greedy import greedy_match
from export.manifest import manifest_builder
from export.onnx_export import export_onnx
from export.onnx_files import external_data
from export.parity import BOUNDS, NOT_CHECKED, Feeds, Outputs, ParityReport, compare
from export.repository import write_version
from export.source_blocks import build_int4
from export.tasks import (
    SPECS,
    TaskSpec,
    eval_inputs,
    generated_inputs,
    generation_layout,
    load_reference,
    onnx_feeds,
    parity_extent,
    torch_outputs,
)
from export.variants import (
    ALL_VARIANTS,
    DRAFT_HEAD_TOKENS,
    DRAFT_VARIANTS,
    INT8_RECIPES,
    VARIANT_FILES,
    Int8Recipe,
    VariantResult,
    build_draft,
    build_int8,
    build_variant,
)
from service.manifest import (
    MODEL_NAME_PATTERN,
    CascadeCalibration,
    GenerationLayout,
    Task,
    TeacherRef,
)

GREEDY_PROMPTS = 8
GREEDY_NEW_TOKENS = 16


class ExportError(RuntimeError):
    """The export cannot produce a servable version (nothing is written)."""


@dataclass
class ExportResult:
    version_dir: Path | None
    variants: list[VariantResult] = field(default_factory=list)
    max_length: int | None = None  # the window the manifest gives the service
    trained_length: int | None = None  # the longest sequence the model was trained on, when a report says
    cascade: CascadeCalibration | None = None  # a pair's calibrated cascade, as the manifest records it


def trained_length(model_dir: Path) -> int | None:
    """`max_length` of the run that made the model (its distill or train report), if one says."""
    for name in ("distill_report.json", "train_report.json"):
        path = model_dir / name
        if path.is_file():
            length = json.loads(path.read_text(encoding="utf-8")).get("recipe", {}).get("max_length")
            return int(length) if isinstance(length, int) else None
    return None


def max_sequence_length(tokenizer: Any, config: Any) -> int:
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    usable = [int(x) for x in limits if isinstance(x, int) and 1 < x < 1_000_000]
    if not usable:
        raise ExportError("cannot tell the model's maximum sequence length from its config or tokenizer")
    return min(usable)


def _window(tokenizer: Any, config: Any, wanted: int | None) -> int:
    """The model's own limit, or the narrower window asked for; a wider one is an error."""
    limit = max_sequence_length(tokenizer, config)
    if wanted is not None and wanted > limit:
        raise ExportError(f"max length {wanted} is past the model's limit of {limit} tokens")
    return limit if wanted is None else wanted


@dataclass(frozen=True)
class PairSpec:
    """A student exported as the pair of a teacher already in the repository: `teacher` as served, its
    HF directory (the calibration's reference), and the agreement the cascade should reach."""

    teacher: TeacherRef
    teacher_dir: Path
    target: float = 0.99
    # The draft variant built from this checkpoint instead of the student's own (same tokenizer): e.g. a copy
    # tuned on the teacher's greedy text, which drafts better than the student answers (docs/benchmarks.md).
    draft_from: Path | None = None
    # The draft's output head cut to this many first ids plus the contexts' (export/draft_head.py; 0: whole).
    draft_head_tokens: int = DRAFT_HEAD_TOKENS


@dataclass
class _Parity:
    """Everything the gate needs, computed once: inputs, PyTorch outputs, greedy prompts."""

    spec: TaskSpec
    model: Any
    layout: GenerationLayout | None
    batches: list[Feeds]
    reference: list[Outputs]
    eval_batches: int
    prompts: list[list[int]]
    require_eval_data: bool = True

    def judge(self, variant: str, path: Path) -> tuple[ParityReport, list[str]]:
        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as e:  # a graph ORT cannot even load fails its gate, with the reason
            empty = ParityReport(max_abs_diff=float("inf"), top1_agreement=0.0, rows=0)
            return empty, [f"ONNX Runtime cannot load it on CPU: {str(e).splitlines()[0][:200]}"]
        names = [i.name for i in session.get_inputs()]
        wanted = list(self.spec.outputs)
        whole = whole_head(session, int(self.model.config.vocab_size)) if CONTEXT_INPUT in names else {}
        got = [
            dict(zip(wanted, session.run(wanted, onnx_feeds(b, names, self.layout) | whole), strict=True))
            for b in self.batches
        ]
        report = compare(
            self.reference,
            got,
            self.batches,
            self.spec.outputs,
            self.spec.per_position,
            self.eval_batches or None,
            BOUNDS[variant].min_cosine if self.spec.cosine else None,
        )
        if self.layout is not None and BOUNDS[variant].min_greedy_match is not None:
            match = greedy_match(session, self.layout, self.model, self.prompts, GREEDY_NEW_TOKENS)
            report = replace(report, greedy_match=match)
        return report, BOUNDS[variant].failures(report, self.require_eval_data)


def whole_head(session: ort.InferenceSession, vocabulary: int) -> dict[str, np.ndarray]:
    """The feed that makes a draft's cut head (export/draft_head.py) score every token in id order: the gate
    judges all of its head's numbers, as for an uncut one."""
    tokens = int(session.get_modelmeta().custom_metadata_map[HEAD_TOKENS_KEY])
    return {CONTEXT_INPUT: DraftHead(tokens, vocabulary).every_token()}


def _prepare_parity(
    spec: TaskSpec,
    model: Any,
    tokenizer: Any,
    max_length: int,
    eval_data: Path | None,
    seed: int,
) -> _Parity:
    layout = None
    if spec.task == "text-generation":
        chat = chat_spec(tokenizer)
        generation_config = getattr(model, "generation_config", None)
        layout = generation_layout(
            model.config, tokenizer, generation_config, chat.eos_token if chat is not None else None
        )
    length, texts = parity_extent(spec, model.config, max_length)
    batches = generated_inputs(spec, tokenizer, model.config, length, seed)
    from_eval = eval_inputs(spec, tokenizer, eval_data, length, texts) if eval_data is not None else []
    batches += from_eval
    reference = [torch_outputs(model, spec, b, tokenizer.mask_token_id) for b in batches]
    prompts: list[list[int]] = []
    if layout is not None:
        source = from_eval or batches
        rows = [
            row[mask.astype(bool)].tolist()
            for b in source
            for row, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
        ]
        budget = max(1, max_length - GREEDY_NEW_TOKENS)
        prompts = [r[: min(budget, 12)] for r in rows if r][:GREEDY_PROMPTS]
    return _Parity(spec, model, layout, batches, reference, len(from_eval), prompts)


def _judged(
    variant: str, path: Path, seconds: float, parity: _Parity, progress: Callable[[str], None]
) -> VariantResult:
    progress(f"parity check: {variant} vs PyTorch")
    report, problems = parity.judge(variant, path)
    data = external_data(path)
    data_bytes = data.stat().st_size if data is not None else 0
    return VariantResult(variant, path, report, problems, seconds, path.stat().st_size, data_bytes=data_bytes)


def _variant(
    variant: str,
    export_dir: Path,
    fp32: Path,
    work: Path,
    parity: _Parity,
    progress: Callable[[str], None],
    draft_head_tokens: int = DRAFT_HEAD_TOKENS,
) -> VariantResult:
    """The variant built and judged; int8 with each of INT8_RECIPES in turn until the gate passes one. The
    refusals are kept: in `tried` of the one that passed, as the problems when none did."""
    if variant in DRAFT_VARIANTS:
        return _build_and_judge(variant, None, export_dir, fp32, work, parity, progress, draft_head_tokens)
    if variant != "int8":
        return _build_and_judge(variant, None, export_dir, fp32, work, parity, progress)
    tried: list[str] = []
    for recipe in INT8_RECIPES:
        outcome = _build_and_judge(variant, recipe, export_dir, fp32, work, parity, progress)
        if outcome.passed or any(problem.startswith(NOT_CHECKED) for problem in outcome.problems):
            outcome.tried = tried  # without eval data, no recipe can be checked: one answer says so
            return outcome
        tried.append(f"{recipe.name}: {'; '.join(outcome.problems)}")
    outcome.problems = tried
    return outcome


def _build_and_judge(
    variant: str,
    recipe: Int8Recipe | None,
    export_dir: Path,
    fp32: Path,
    work: Path,
    parity: _Parity,
    progress: Callable[[str], None],
    draft_head_tokens: int = 0,
) -> VariantResult:
    """One variant (int8: with one recipe; a draft: its head cut to `draft_head_tokens`) built and judged;
    one that cannot be built is reported as such, never silently dropped."""
    started = time.perf_counter()
    progress(f"building the {variant} variant" + (f" ({recipe.name})" if recipe else ""))
    head_tokens, described = None, None
    try:
        if variant in DRAFT_VARIANTS:
            path = work / VARIANT_FILES[variant]
            head_tokens = build_draft(fp32, path, draft_head_tokens)
        elif variant == "int4":
            path = work / VARIANT_FILES[variant]
            described = build_int4(fp32, path)
        elif recipe is None:
            path = build_variant(variant, export_dir, fp32, work)
        else:
            path = work / f"int8-{recipe.name}" / VARIANT_FILES[variant]
            path.parent.mkdir(parents=True, exist_ok=True)
            build_int8(fp32, path, recipe)
    except Exception as e:
        problem = f"could not be built: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        empty = ParityReport(max_abs_diff=float("inf"), top1_agreement=0.0, rows=0)
        return VariantResult(
            variant, work / VARIANT_FILES[variant], empty, [problem], 0.0, 0, recipe=_name(recipe)
        )
    outcome = _judged(variant, path, time.perf_counter() - started, parity, progress)
    outcome.recipe, outcome.head_tokens = described or _name(recipe), head_tokens
    return outcome


def _draft_from(
    source_dir: Path,
    spec: TaskSpec,
    tokenizer: Any,
    max_length: int,
    eval_data: Path | None,
    seed: int,
    opset: int | None,
    require_eval_data: bool,
    work: Path,
    progress: Callable[[str], None],
    head_tokens: int = DRAFT_HEAD_TOKENS,
) -> VariantResult:
    """The draft variant built from another checkpoint of the same tokenizer, and judged against that
    checkpoint's own PyTorch outputs (what the gate guards is the build, as for the student's own draft:
    every token it proposes is checked by the teacher)."""
    progress(f"loading the draft's checkpoint {source_dir}")
    source, source_tokenizer = load_reference(source_dir, spec)
    if source_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ExportError(f"{source_dir}: not the model's tokenizer, so it cannot draft for its teacher")
    parity = _prepare_parity(spec, source, tokenizer, max_length, eval_data, seed)
    parity.require_eval_data = require_eval_data
    source_fp32 = export_onnx(source_dir, spec.task, work / "draft-source", opset)
    outcome = _variant("draft", work / "draft-source", source_fp32, work, parity, progress, head_tokens)
    outcome.source = str(source_dir)
    return outcome


def _name(recipe: Int8Recipe | None) -> str | None:
    return None if recipe is None else recipe.name


def usage_problems(
    task: str,
    name: str,
    repository: Path,
    variants: Sequence[str],
    eval_data: Path | None,
    max_length: int | None = None,
) -> list[str]:
    """What is wrong with the request itself, found before any work (the CLI's usage errors)."""
    problems = []
    if task not in SPECS:
        problems.append(f"unknown task {task!r}; choose from {', '.join(SPECS)}")
    if not re.fullmatch(MODEL_NAME_PATTERN, name):
        problems.append(
            f"name {name!r}: lowercase letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    if repository.exists() and not repository.is_dir():
        problems.append(f"repository {repository} is a file, not a directory")
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown:
        problems.append(f"unknown variant(s) {unknown}; choose from {', '.join(ALL_VARIANTS)}")
    if "fp32" not in variants:
        problems.append(
            "the fp32 variant is required: it is the reference every other variant is checked with"
        )
    if eval_data is not None and not eval_data.is_file():
        problems.append(f"{eval_data}: no such eval file")
    if max_length is not None and max_length < 2:
        problems.append(f"max length {max_length}: a window needs at least 2 tokens")
    return problems


def export_model(
    model_dir: Path,
    task: Task,
    name: str,
    repository: Path,
    variants: Sequence[str] = ("fp32",),
    opset: int | None = None,
    seed: int = 0,
    eval_data: Path | None = None,
    progress: Callable[[str], None] = lambda message: None,
    max_length: int | None = None,
    require_eval_data: bool = True,
    pair: PairSpec | None = None,
) -> ExportResult:
    """Export, gate every variant on parity, and write the ones that pass as the next version.

    `max_length` narrows the window the service accepts (e.g. to the length the model was trained on).
    Without `eval_data`, fp16 and int8 cannot be checked and are not written, unless `require_eval_data`
    is False (speed benchmarks of random-weight models, whose answers mean nothing anyway). `pair` names
    the served teacher this student pairs with, and calibrates their cascade (with `eval_data`); the draft
    variant is built for a generation student's pair only (others have no teacher to draft for)."""
    problems = usage_problems(task, name, repository, variants, eval_data, max_length)
    if problems:
        raise ExportError("; ".join(problems))
    spec = SPECS[task]
    if task != "text-generation" or pair is None:  # only a generation student drafts (for its teacher)
        variants = [v for v in variants if v not in DRAFT_VARIANTS]

    progress(f"loading the PyTorch reference from {model_dir}")
    model, tokenizer = load_reference(model_dir, spec)
    if max_length is None and spec.task == "sentence-embeddings":
        # sentence-transformers' max_seq_length (MiniLM: 256 of its 512 positions): it truncates there
        max_length = min(model.max_length, max_sequence_length(tokenizer, model.config))
    max_length = _window(tokenizer, model.config, max_length)
    progress("running PyTorch over the parity inputs")
    parity = _prepare_parity(spec, model, tokenizer, max_length, eval_data, seed)
    parity.require_eval_data = require_eval_data
    cascade = None
    if pair is not None and eval_data is not None and spec.task in CASCADE_TASKS:
        teacher = load_reference(pair.teacher_dir, spec)
        cascade = calibrate_pair(
            (model, tokenizer), teacher, task, eval_data, pair.target, max_length, progress=progress
        )

    result = ExportResult(
        version_dir=None, max_length=max_length, trained_length=trained_length(model_dir), cascade=cascade
    )
    with tempfile.TemporaryDirectory(prefix="distilserve-export-") as tmp:
        work = Path(tmp)
        export_dir = work / "onnx"
        started = time.perf_counter()
        progress("exporting to ONNX")
        fp32 = export_onnx(model_dir, task, export_dir, opset)
        result.variants.append(_judged("fp32", fp32, time.perf_counter() - started, parity, progress))
        for variant in [v for v in ALL_VARIANTS if v in variants and v != "fp32"]:
            if variant in DRAFT_VARIANTS and pair is not None and pair.draft_from is not None:
                source = (pair.draft_from, spec, tokenizer, max_length, eval_data, seed, opset)
                cut = pair.draft_head_tokens
                result.variants.append(_draft_from(*source, parity.require_eval_data, work, progress, cut))
                continue
            cut = pair.draft_head_tokens if pair is not None else DRAFT_HEAD_TOKENS
            result.variants.append(_variant(variant, export_dir, fp32, work, parity, progress, cut))
        passed = {r.variant: r for r in result.variants if r.passed}
        if "fp32" not in passed:
            return result  # nothing is written when the reference variant itself fails

        tokenizer_file = export_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ExportError(f"{model_dir} has no fast tokenizer (tokenizer.json); the service needs one")
        files = {VARIANT_FILES[v]: r.path for v, r in passed.items()} | {"tokenizer.json": tokenizer_file}
        files |= {data.name: data for r in passed.values() if (data := external_data(r.path)) is not None}
        rejected = {r.variant: "; ".join(r.problems) for r in result.variants if not r.passed}
        manifest_for = manifest_builder(
            name,
            spec,
            model,
            tokenizer,
            max_length,
            passed,
            rejected,
            fp32,
            tokenizer_file,
            parity.layout,
            model_dir,
            pair.teacher if pair is not None else None,
            cascade,
        )
        progress(f"writing {name} into {repository}")
        result.version_dir = write_version(repository, name, files, manifest_for)
    return result
