"""Every task exports, passes its parity gate and lands as a new version; failing variants are skipped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from export import parity, pipeline
from export.cli import app
from export.greedy import greedy_onnx, greedy_torch
from export.pipeline import ExportError, export_model
from export.tasks import generation_layout
from export.variants import Int8Recipe
from service.repository import read_version, scan_repository
from service.runtime import choose_variant

TASKS = ("text-classification", "question-answering", "fill-mask", "text-generation")


def _eval_file(task: str, folder: Path) -> Path:
    """A small eval file of the task's format, in the words the tiny models' tokenizers were trained on."""
    from tests.tiny_models import CORPUS

    lines = CORPUS[:4] * 4
    if task == "question-answering":
        context = lines[2]
        qas = [
            {
                "id": str(i),
                "question": q,
                "answers": [{"text": "1950", "answer_start": context.index("1950")}],
            }
            for i, q in enumerate(["Who founded Acme?", "When was it founded?", "Where is Springfield?"] * 4)
        ]
        doc = {"data": [{"title": "Acme", "paragraphs": [{"context": context, "qas": qas}]}]}
        path = folder / "eval.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
    elif task == "text-classification":
        path = folder / "eval.jsonl"
        rows = [{"text": t, "label": "positive" if "loved" in t else "negative"} for t in lines]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path = folder / "eval.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def exported(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    repository = tmp_path_factory.mktemp("repo")
    out = {}
    for task in TASKS:
        result = export_model(tiny_models[task], task, task.split("-")[0], repository, ("fp32",))  # type: ignore[arg-type]
        assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
        out[task] = result.version_dir
    return out


@pytest.mark.parametrize("task", TASKS)
def test_each_task_exports_within_fp32_parity(exported: dict[str, Path], task: str) -> None:
    version = read_version(exported[task])
    m = version.manifest
    assert m.task == task
    fp32 = m.variants["fp32"]
    assert fp32.parity["max_abs_diff"] <= 1e-4 and fp32.parity["top1_agreement"] >= 0.999
    outputs = {o.name for o in m.outputs}
    if task == "question-answering":
        assert {"start_logits", "end_logits"} <= outputs
    else:
        assert "logits" in outputs
    if task == "text-generation":
        assert m.generation is not None and m.generation.num_layers == 2 and m.generation.head_dim == 16
        assert fp32.parity["greedy_match"] == 1.0
        assert "past_key_values.0.key" in m.input_names() and "present.1.value" in outputs
    if task == "fill-mask":
        assert m.special_tokens.mask is not None


def test_onnx_greedy_loop_matches_pytorch_generate(
    tiny_models: dict[str, Path], exported: dict[str, Path]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_models["text-generation"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["text-generation"])
    layout = generation_layout(model.config, tokenizer)
    session = ort.InferenceSession(
        str(exported["text-generation"] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    for text in ("I loved this", "Acme was founded by", "Who"):
        prompt = tokenizer(text)["input_ids"]
        expected = greedy_torch(model, prompt, 20, layout.eos_token_id)
        assert greedy_onnx(session, layout, prompt, 20) == expected
        assert len(expected) >= 1


def test_a_second_export_is_version_2_and_leaves_version_1_untouched(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model_dir = tiny_models["text-classification"]
    first = export_model(model_dir, "text-classification", "sentiment", tmp_path, ("fp32",)).version_dir
    assert first is not None and first.name == "1"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()}
    second = export_model(model_dir, "text-classification", "sentiment", tmp_path, ("fp32",)).version_dir
    assert second is not None and second.name == "2"
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()} == before
    assert [v.version for v in scan_repository(tmp_path).versions] == [1, 2]
    assert not [p for p in (tmp_path / "sentiment").iterdir() if p.name.startswith(".")]  # no staging left


def test_a_variant_that_fails_its_gate_is_reported_and_not_written(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(parity.BOUNDS, "int8", parity.ParityBounds(max_abs_diff=0.0, min_top1_agreement=1.0))
    result = export_model(
        tiny_models["text-classification"], "text-classification", "s", tmp_path, ("fp32", "int8")
    )
    int8 = next(r for r in result.variants if r.variant == "int8")
    assert not int8.passed and "max |diff|" in int8.problems[0]
    assert result.version_dir is not None
    manifest = json.loads((result.version_dir / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"fp32"}
    assert not (result.version_dir / "model.int8.onnx").exists()
    assert manifest["rejected_variants"] == {"int8": "; ".join(int8.problems)}  # why, for the operator


def test_nothing_is_written_when_fp32_fails(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(parity.BOUNDS, "fp32", parity.ParityBounds(max_abs_diff=-1.0, min_top1_agreement=1.0))
    result = export_model(tiny_models["fill-mask"], "fill-mask", "m", tmp_path, ("fp32",))
    assert result.version_dir is None
    assert not (tmp_path / "m").exists()


def test_bad_requests_fail_before_any_work(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="fp32 variant is required"):
        export_model(tiny_models["fill-mask"], "fill-mask", "m", tmp_path, ("int8",))
    with pytest.raises(ExportError, match="unknown variant"):
        export_model(tiny_models["fill-mask"], "fill-mask", "m", tmp_path, ("fp32", "fp8"))
    with pytest.raises(ExportError, match="no such eval file"):
        export_model(
            tiny_models["fill-mask"], "fill-mask", "m", tmp_path, ("fp32",), eval_data=tmp_path / "x"
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "../evil"], "name '../evil': lowercase letters"),
        (["--name", "Has Space"], "name 'Has Space'"),
        (["--variants", "int8"], "fp32 variant is required"),
        (["--variants", "fp32,fp8"], "unknown variant(s) ['fp8']"),
        (["--eval-data", "/nowhere.txt"], "/nowhere.txt: no such eval file"),
        (["--task", "summarization"], "unknown task 'summarization'"),
    ],
)
def test_the_cli_refuses_a_bad_request_before_any_work(
    tiny_models: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    command = [
        str(tiny_models["fill-mask"]),
        "--task",
        "fill-mask",
        "--name",
        "m",
        "--repository",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, [*command, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert list(tmp_path.iterdir()) == []  # nothing made, not even a directory


def test_the_cli_says_what_is_wrong_with_the_model_or_data_in_one_line(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    repository_file = tmp_path / "afile"
    repository_file.touch()
    mlm = str(tiny_models["fill-mask"])
    refused = CliRunner().invoke(
        app, [mlm, "--task", "fill-mask", "--name", "m", "--repository", str(repository_file)]
    )
    assert refused.exit_code == 2
    assert f"error: repository {repository_file} is a file, not a directory\n" in refused.output

    wrong_task = CliRunner().invoke(
        app, [mlm, "--task", "text-classification", "--name", "m", "--repository", str(tmp_path / "r")]
    )
    assert wrong_task.exit_code == 1 and "Traceback" not in wrong_task.output
    (line,) = [line for line in wrong_task.output.splitlines() if line.startswith("error: ")]
    assert (
        line.startswith("error: export failed: ") and "ForMaskedLM, not a text-classification model" in line
    )

    empty = tmp_path / "empty.txt"
    empty.touch()
    no_lines = CliRunner().invoke(
        app,
        [
            mlm,
            "--task",
            "fill-mask",
            "--name",
            "m",
            "--repository",
            str(tmp_path / "r"),
            "--eval-data",
            str(empty),
        ],
    )
    assert no_lines.exit_code == 1
    (line,) = [line for line in no_lines.output.splitlines() if line.startswith("error: ")]
    assert "no text lines found" in line


def test_the_cli_in_a_log_says_what_it_is_doing_at_an_interval(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output that is not a terminal gets no spinner: a plain line every DISTILSERVE_PROGRESS_INTERVAL_S."""
    monkeypatch.setenv("DISTILSERVE_PROGRESS_INTERVAL_S", "0.01")
    args = ["--task", "fill-mask", "--name", "m", "--repository", str(tmp_path), "--variants", "fp32"]
    result = CliRunner().invoke(app, [str(tiny_models["fill-mask"]), *args])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("export: ")]
    assert any(line.startswith("export: exporting to ONNX, elapsed") for line in lines), (
        lines
    )  # the slow step
    assert re.fullmatch(rf"export: writing m into {tmp_path}, elapsed \d+:\d\d", lines[-1])  # the last one


def test_optimized_and_fp16_variants_keep_the_answers(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    result = export_model(
        tiny_models["question-answering"],
        "question-answering",
        "qa",
        tmp_path / "models",
        ("fp32", "optimized", "fp16"),
        eval_data=_eval_file("question-answering", tmp_path),
    )
    assert result.version_dir is not None
    manifest = read_version(result.version_dir).manifest
    assert {"fp32", "optimized", "fp16"} <= set(manifest.variants)
    assert manifest.variants["optimized"].optimized and manifest.variants["fp16"].precision == "fp16"
    session = ort.InferenceSession(
        str(result.version_dir / "model.fp16.onnx"), providers=["CPUExecutionProvider"]
    )
    feeds = {
        "input_ids": np.array([[2, 10, 11, 3]]),
        "attention_mask": np.ones((1, 4), dtype=np.int64),
        "token_type_ids": np.zeros((1, 4), dtype=np.int64),
    }
    [start_logits] = session.run(["start_logits"], feeds)
    assert start_logits.dtype == np.float32  # fp32 at the boundary: clients and the service never see fp16


def test_int8_is_smaller_and_agrees_on_the_demo_eval_set(
    classification_repository: Path, demo_pair: tuple[Path, Path]
) -> None:
    manifest = read_version(classification_repository / "sentiment" / "1").manifest
    fp32, int8 = manifest.variants["fp32"], manifest.variants["int8"]
    assert int8.size_bytes < fp32.size_bytes
    assert int8.parity["top1_agreement"] >= 0.99
    eval_file = demo_pair[1].parent.parent / "data" / "classification" / "eval.jsonl"
    examples = len(eval_file.read_text().splitlines())
    assert int8.parity["rows"] == int8.parity["eval_rows"] == min(examples, 256)  # on the eval texts
    assert choose_variant(manifest, "auto", on_gpu=False) == "int8"  # checked, so a CPU serves it
    assert choose_variant(manifest, "auto", on_gpu=True) == "fp16"


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_without_eval_data_a_reduced_precision_variant_is_not_checked_and_not_served(
    tiny_models: dict[str, Path], tmp_path: Path, variant: str
) -> None:
    """Random tokens check an fp32 graph's numbers, not a quantized model's answers: the gate says so."""
    result = export_model(
        tiny_models["text-classification"], "text-classification", "s", tmp_path, ("fp32", variant)
    )
    assert result.version_dir is not None
    reduced = next(r for r in result.variants if r.variant == variant)
    assert not reduced.passed and reduced.problems[0].startswith("not checked: no eval data (--eval-data)")
    manifest = read_version(result.version_dir).manifest
    assert set(manifest.variants) == {"fp32"} and not (result.version_dir / f"model.{variant}.onnx").exists()
    assert manifest.rejected_variants[variant] == reduced.problems[0]  # why, for the operator
    assert manifest.variants["fp32"].parity["eval_rows"] == 0  # its top-1 was on random tokens only
    assert choose_variant(manifest, "auto", on_gpu=variant == "fp16") == "fp32"


def test_the_cli_says_what_the_gate_could_not_check_and_narrows_the_window(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # narrower than the summary: its rows still come out whole
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_models["text-classification"], model_dir)
    (model_dir / "train_report.json").write_text(json.dumps({"recipe": {"max_length": 16}}))
    args = [
        str(model_dir),
        "--task",
        "text-classification",
        "--name",
        "s",
        "--repository",
        str(tmp_path / "r"),
    ]
    unchecked = CliRunner().invoke(app, [*args, "--variants", "fp32,int8"])
    assert unchecked.exit_code == 0, unchecked.output
    out = " ".join(unchecked.output.split())
    assert "no --eval-data: the parity gate compared random tokens only" in out
    assert "int8 not written: not checked: no eval data" in out
    assert re.search(
        r"int8 \(dynamic\) \S+ \S+ \S+ random 21 ", out
    )  # the recipe, and what its agreement was measured on
    assert "trained on at most 16 tokens but the service will accept 64" in out
    assert read_version(tmp_path / "r" / "s" / "1").manifest.max_sequence_length == 64

    eval_data = _eval_file("text-classification", tmp_path)
    checked = CliRunner().invoke(
        app, [*args, "--variants", "fp32", "--eval-data", str(eval_data), "--max-length", "16"]
    )
    assert checked.exit_code == 0, checked.output
    assert "no --eval-data" not in checked.output and "trained on at most" not in checked.output
    manifest = read_version(tmp_path / "r" / "s" / "2").manifest
    assert manifest.max_sequence_length == manifest.tokenizer.max_length == 16
    assert manifest.variants["fp32"].parity["eval_rows"] == 16
    too_long = CliRunner().invoke(app, [*args, "--variants", "fp32", "--max-length", "100000"])
    assert too_long.exit_code == 1 and "past the model's limit of 64 tokens" in too_long.output


def test_the_appending_decoder_builds_every_variant_within_its_gate(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """distilserve's own GPT-2 graph goes through the same variant builders as optimum's (ORT's GPT-2
    fusions, int8, fp16) and each passes its parity gate against PyTorch. The model is untrained, so its
    answers on real text are near ties that int8 may flip: the gate runs on random tokens, as a benchmark's
    would (require_eval_data=False). Exported as a student, it gets the draft variant too."""
    from export.pipeline import PairSpec
    from export.variants import DEFAULT_VARIANTS
    from service.manifest import TeacherRef

    result = export_model(
        tiny_models["text-generation"],
        "text-generation",
        "lm",
        tmp_path,
        DEFAULT_VARIANTS,
        require_eval_data=False,
        pair=PairSpec(TeacherRef(name="lm-teacher", version=1), tiny_models["text-generation"]),
    )
    assert {r.variant: r.problems for r in result.variants} == {v: [] for v in DEFAULT_VARIANTS}
    assert result.version_dir is not None
    m = read_version(result.version_dir).manifest
    assert m.generation is not None and m.generation.present_positions == "new"
    assert set(m.variants) == set(DEFAULT_VARIANTS)
    assert m.variants["int8"].parity["eval_rows"] == 0  # the manifest says what it was checked on
    assert m.variants["fp32"].parity["greedy_match"] == 1.0


def test_int8_falls_back_to_the_next_recipe_the_gate_passes(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe that fails (here: cannot even be built) does not cost the model its int8 variant while a
    later one passes; the manifest says which recipe was written and why the first was refused."""
    first, second = (
        Int8Recipe("broken", method="nonexistent"),
        Int8Recipe("blockwise", method="weight-only"),
    )  # type: ignore[arg-type]
    monkeypatch.setattr(pipeline, "INT8_RECIPES", (first, second))
    eval_file = _eval_file("text-classification", tmp_path)
    model = tiny_models["text-classification"]
    result = export_model(model, "text-classification", "s", tmp_path, ("fp32", "int8"), eval_data=eval_file)
    assert result.version_dir is not None
    int8 = read_version(result.version_dir).manifest.variants["int8"]
    assert int8.recipe == "blockwise" and int8.parity["top1_agreement"] >= 0.99
    assert len(int8.refused_recipes) == 1 and int8.refused_recipes[0].startswith("broken: could not be built")
    graph = onnx.load(str(result.version_dir / int8.file)).graph
    assert any(n.op_type == "MatMulNBits" for n in graph.node)

    monkeypatch.setattr(pipeline, "INT8_RECIPES", (first, Int8Recipe("also-broken", method="nope")))  # type: ignore[arg-type]
    result = export_model(model, "text-classification", "t", tmp_path, ("fp32", "int8"), eval_data=eval_file)
    assert result.version_dir is not None
    manifest = read_version(result.version_dir).manifest
    assert "int8" not in manifest.variants
    reasons = manifest.rejected_variants["int8"]
    assert reasons.startswith("broken: could not be built") and "; also-broken: could not be built" in reasons
