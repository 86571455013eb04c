"""One export: HF directory -> ONNX variants -> parity gate -> a new version in the model repository."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from export.onnx_export import describe_graph, export_onnx
from export.parity import BOUNDS, Feeds, ParityReport, compare, generated_batches
from export.repository import write_version
from service.manifest import (
    DistillationRecord,
    Manifest,
    ModelScore,
    SpecialTokens,
    Task,
    TokenizerSpec,
    VariantSpec,
)
from service.repository import sha256_of
from training.report import git_revision

VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}
VARIANT_DEVICE = {"fp32": "any", "int8": "cpu", "fp16": "gpu"}
PARITY_OUTPUT: dict[str, str] = {"text-classification": "logits", "fill-mask": "logits"}
SUPPORTED_TASKS = ("text-classification",)
SUPPORTED_VARIANTS = ("fp32", "int8")


class ExportError(RuntimeError):
    """The export cannot produce a servable version (nothing is written)."""


@dataclass
class VariantResult:
    variant: str
    path: Path
    parity: ParityReport
    problems: list[str]
    seconds: float
    size_bytes: int

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass
class ExportResult:
    version_dir: Path | None
    variants: list[VariantResult] = field(default_factory=list)


def _load_reference(model_dir: Path, task: Task) -> tuple[Any, Any]:
    """The PyTorch model and HF tokenizer the ONNX graph must reproduce."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    classes = {"text-classification": AutoModelForSequenceClassification}
    model = classes[task].from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def _torch_reference(model: Any, output: str) -> Callable[[Feeds], np.ndarray]:
    import torch

    def run(feeds: Feeds) -> np.ndarray:
        with torch.no_grad():
            out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        return getattr(out, output).float().numpy()

    return run


def _quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8 on the plain export (quantizing an optimized graph fails, see FACTS.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        fp32, out, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}
    )


def max_sequence_length(tokenizer: Any, config: Any) -> int:
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    usable = [int(x) for x in limits if isinstance(x, int) and 1 < x < 1_000_000]
    if not usable:
        raise ExportError("cannot tell the model's maximum sequence length from its config or tokenizer")
    return min(usable)


def distillation_record(model_dir: Path) -> DistillationRecord | None:
    """The student's `distill_report.json` (written by training/), if there is one."""
    path = model_dir / "distill_report.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    teacher, student = report.get("teacher", {}), report.get("student", {})
    evaluation = report.get("eval", {})
    return DistillationRecord(
        metric=str(report.get("metric", "score")),
        teacher=ModelScore(
            source=str(teacher.get("source", "?")), params=teacher["params"], score=teacher.get("score")
        ),
        student=ModelScore(source=str(model_dir), params=student["params"], score=student.get("score")),
        agreement=report.get("agreement"),
        eval_source=evaluation.get("source"),
        eval_examples=evaluation.get("examples"),
    )


def export_model(
    model_dir: Path,
    task: Task,
    name: str,
    repository: Path,
    variants: Sequence[str] = ("fp32",),
    opset: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = lambda message: None,
) -> ExportResult:
    """Export, gate every variant on parity, and write the ones that pass as the next version."""
    if task not in SUPPORTED_TASKS:
        raise ExportError(f"task {task!r} is not exportable yet (supported: {', '.join(SUPPORTED_TASKS)})")
    unknown = [v for v in variants if v not in SUPPORTED_VARIANTS]
    if unknown:
        raise ExportError(f"unknown variant(s) {unknown}; choose from {', '.join(SUPPORTED_VARIANTS)}")
    if "fp32" not in variants:
        raise ExportError(
            "the fp32 variant is required: it is the reference every other variant is checked with"
        )

    progress(f"loading the PyTorch reference from {model_dir}")
    model, tokenizer = _load_reference(model_dir, task)
    max_length = max_sequence_length(tokenizer, model.config)
    output = PARITY_OUTPUT[task]
    reference = _torch_reference(model, output)
    batches = generated_batches(
        vocab_size=model.config.vocab_size,
        special_ids=tokenizer.all_special_ids,
        max_length=max_length,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        pad_id=tokenizer.pad_token_id or 0,
        seed=seed,
        with_token_types="token_type_ids" in tokenizer.model_input_names,
    )

    result = ExportResult(version_dir=None)
    with tempfile.TemporaryDirectory(prefix="distilserve-export-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        progress("exporting to ONNX with optimum")
        fp32 = export_onnx(model_dir, task, work / "onnx", opset)
        exported = {"fp32": fp32}
        build_seconds = {"fp32": time.perf_counter() - started}
        if "int8" in variants:
            started = time.perf_counter()
            progress("quantizing to int8 (dynamic)")
            exported["int8"] = work / VARIANT_FILES["int8"]
            _quantize_int8(fp32, exported["int8"])
            build_seconds["int8"] = time.perf_counter() - started
        for variant, path in exported.items():
            progress(f"parity check: {variant} vs PyTorch")
            report = compare(reference, path, batches, output)
            result.variants.append(
                VariantResult(
                    variant,
                    path,
                    report,
                    BOUNDS[variant].failures(report),
                    build_seconds[variant],
                    path.stat().st_size,
                )
            )
        passed = {r.variant: r for r in result.variants if r.passed}
        if "fp32" not in passed:
            return result  # nothing is written when the reference variant itself fails

        inputs, outputs, opset_used = describe_graph(fp32)
        tokenizer_file = work / "onnx" / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ExportError(f"{model_dir} has no fast tokenizer (tokenizer.json); the service needs one")
        files = {VARIANT_FILES[v]: r.path for v, r in passed.items()} | {"tokenizer.json": tokenizer_file}
        variant_specs = {
            v: VariantSpec(
                file=VARIANT_FILES[v],
                precision=v,  # type: ignore[arg-type]
                device=VARIANT_DEVICE[v],  # type: ignore[arg-type]
                size_bytes=r.size_bytes,
                sha256=sha256_of(r.path),
                parity=r.parity.as_dict(),
            )
            for v, r in passed.items()
        }
        special = SpecialTokens(
            pad=tokenizer.pad_token_id,
            cls=tokenizer.cls_token_id,
            sep=tokenizer.sep_token_id,
            mask=tokenizer.mask_token_id,
            unk=tokenizer.unk_token_id,
            bos=tokenizer.bos_token_id,
            eos=tokenizer.eos_token_id,
        )
        id2label = getattr(model.config, "id2label", {}) or {}

        def manifest_for(version: int) -> Manifest:
            return Manifest(
                name=name,
                version=version,
                task=task,
                labels={int(k): str(v) for k, v in id2label.items()} if task == "text-classification" else {},
                max_sequence_length=max_length,
                inputs=inputs,
                outputs=outputs,
                variants=variant_specs,
                tokenizer=TokenizerSpec(
                    sha256=sha256_of(tokenizer_file),
                    max_length=max_length,
                    pad_token_id=tokenizer.pad_token_id or 0,
                    lowercase=getattr(tokenizer, "do_lower_case", None),
                ),
                special_tokens=special,
                distillation=distillation_record(model_dir),
                opset=opset_used,
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                git_revision=git_revision(),
                source_model=str(model_dir),
            )

        progress(f"writing {name} into {repository}")
        result.version_dir = write_version(repository, name, files, manifest_for)
    return result
