"""A Llama-family decoder (grouped-query attention, rotary positions, RMSNorm, gated MLP, tied embeddings)
exports through the same path as GPT-2: the appending graph, the parity gate, fp32 and int8, and a manifest
that records the grouped KV layout."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from common.logit_positions import LOGIT_POSITIONS, every_position
from export.greedy import greedy_onnx, greedy_torch
from export.pipeline import PairSpec, export_model
from export.tasks import SPECS, generation_layout, parity_extent
from service.manifest import TeacherRef
from service.repository import read_version
from tests.tiny_models import CORPUS


@pytest.fixture(scope="module")
def eval_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-eval") / "eval.txt"
    path.write_text("\n".join(dict.fromkeys(CORPUS)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def exported(tiny_llama_dir: Path, eval_text: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("llama-repo")
    result = export_model(
        tiny_llama_dir, "text-generation", "llama", repository, ("fp32", "int8"), eval_data=eval_text
    )
    assert {r.variant: r.problems for r in result.variants} == {"fp32": [], "int8": []}
    assert result.version_dir is not None
    return result.version_dir


def test_the_manifest_records_the_grouped_kv_layout(exported: Path) -> None:
    manifest = read_version(exported).manifest
    layout = manifest.generation
    assert layout is not None
    assert (layout.num_layers, layout.num_heads, layout.num_key_value_heads, layout.head_dim) == (2, 4, 2, 16)
    assert layout.present_positions == "new" and (layout.eos_token_id, layout.pad_token_id) == (2, 2)
    shapes = {t.name: t.shape for t in manifest.inputs + manifest.outputs}
    assert shapes["past_key_values.0.key"][1] == 2 and shapes["present.1.value"][1] == 2
    fp32 = manifest.variants["fp32"].parity
    assert fp32["max_abs_diff"] <= 1e-4 and fp32["greedy_match"] == 1.0 and fp32["eval_rows"] > 0


def test_onnx_greedy_with_the_cache_equals_pytorch_generate(tiny_llama_dir: Path, exported: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    layout = generation_layout(model.config, tokenizer)
    session = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    for text in ("I loved this", "Acme was founded by John Smith in 1950", "Who"):
        prompt = tokenizer(text)["input_ids"]
        expected = greedy_torch(model, prompt, 24, layout.eos_token_id)
        assert greedy_onnx(session, layout, prompt, 24) == expected
        assert len(expected) >= 1


def test_int8_quantizes_the_linear_layers_and_keeps_the_tied_head_fp32(exported: Path) -> None:
    """Every Linear layer of a Llama is quantized (the fused graph's weights are constants, q, k and v in one
    multiply, gate and up in another). The embedding table is also the output head: it stays fp32."""
    manifest = read_version(exported).manifest
    assert manifest.variants["int8"].size_bytes < 0.8 * manifest.variants["fp32"].size_bytes
    graph = onnx.load(str(exported / "model.int8.onnx")).graph
    quantized = [n for n in graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")]
    assert len(quantized) == 2 * 4  # qkv, o, gate + up, down in each of the 2 layers
    table = next(i for i in graph.initializer if i.name == "embed_tokens")
    assert table.data_type == onnx.TensorProto.FLOAT


def test_a_large_vocabulary_decoder_checks_parity_on_shorter_inputs() -> None:
    """PyTorch's logits are kept for every parity batch: at SmolLM2's vocabulary (49,152) and 8k window
    they would take tens of GB, so inputs and eval texts are cut to the budget; small models keep theirs."""

    class Config:
        vocab_size = 49_152

    assert parity_extent(SPECS["text-generation"], Config, 8192) == (260, 21)
    Config.vocab_size = 8000  # the demo GPT-2's
    assert parity_extent(SPECS["text-generation"], Config, 128) == (128, 256)
    assert parity_extent(SPECS["text-classification"], Config, 512) == (512, 256)


def test_a_students_draft_variant_has_its_head_and_tables_in_8_bits_and_drafts_only(
    tiny_llama_dir: Path, eval_text: Path, tmp_path: Path
) -> None:
    """The int8 variant keeps the tied head in fp32 (every answer would coarsen); a draft's answers are all
    checked by its teacher, so its head is untied and quantized too: the step's largest weight. Its head is
    cut (export/draft_head.py), the manifest says to how many ids, and the gate judged it whole."""
    vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    cut = vocab // 4
    pair = PairSpec(TeacherRef(name="llama-teacher", version=1), tiny_llama_dir, draft_head_tokens=cut)
    result = export_model(
        tiny_llama_dir,
        "text-generation",
        "llama",
        tmp_path,
        ("fp32", "draft"),
        eval_data=eval_text,
        pair=pair,
    )
    assert {r.variant: r.problems for r in result.variants} == {"fp32": [], "draft": []}
    assert result.version_dir is not None
    manifest = read_version(result.version_dir).manifest
    draft = manifest.variants["draft"]
    assert draft.drafts_only and not manifest.variants["fp32"].drafts_only
    assert draft.head_tokens == cut and manifest.variants["fp32"].head_tokens is None
    assert draft.parity["top1_agreement"] >= 0.85 and draft.parity["eval_rows"] > 0
    graph = onnx.load(str(result.version_dir / draft.file)).graph
    blocked = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(blocked) == 2 * 4 + 1  # qkv, o, gate + up, down in each of the 2 layers, and the head
    tables = [i.name for i in graph.initializer if vocab in i.dims and "scale" not in i.name]
    assert tables and all(
        i.data_type != onnx.TensorProto.FLOAT for i in graph.initializer if i.name in tables
    )  # the head's weight and the lookup's table, both 8-bit
    lookup = next(n for n in graph.node if n.op_type == "Gather" and "embed_tokens" in n.input[0])
    assert lookup.input[0].endswith("_quantized")  # the lookup reads its own 8-bit copy of the table


def test_only_a_generation_student_gets_a_draft_variant(
    tiny_llama_dir: Path, eval_text: Path, tmp_path: Path
) -> None:
    """No teacher, nothing to draft for: the variant is not built, and a user who asked for it is told."""
    from typer.testing import CliRunner

    from export.cli import app

    result = export_model(
        tiny_llama_dir, "text-generation", "llama", tmp_path, ("fp32", "draft"), eval_data=eval_text
    )
    assert [r.variant for r in result.variants] == ["fp32"]
    args = [str(tiny_llama_dir), "--task", "text-generation", "--name", "llama", "--variants", "fp32,draft"]
    args += ["--repository", str(tmp_path / "cli"), "--eval-data", str(eval_text)]
    said = CliRunner().invoke(app, args)
    assert said.exit_code == 0, said.output
    assert "draft not built: only a text-generation student exported with its teacher" in " ".join(
        said.output.split()
    )
    assert not (tmp_path / "cli" / "llama" / "1" / "model.draft.onnx").exists()


def test_a_llama_past_one_files_limit_exports_serves_and_is_checked_with_its_weights_beside_it(
    tiny_llama_dir: Path, eval_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past protobuf's 2 GB (a Llama of ~500 M parameters in fp32; the limit lowered here to the tiny
    model's size) every variant's weights go into one file beside its graph: the repository lists and
    checks it, the service opens it (without caching its optimised graph, which would not fit one file
    either), and the greedy text is still PyTorch's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export import onnx_files
    from service.repository import RepositoryError
    from service.runtime import ort_engine_factory
    from service.settings import Settings

    monkeypatch.setattr(onnx_files, "ONE_FILE_BYTES", 1000)
    pair = PairSpec(TeacherRef(name="llama-teacher", version=1), tiny_llama_dir)
    variants = ("fp32", "int8", "draft")
    repository = tmp_path / "repo"
    result = export_model(
        tiny_llama_dir, "text-generation", "llama", repository, variants, eval_data=eval_text, pair=pair
    )
    assert {r.variant: r.problems for r in result.variants} == {v: [] for v in variants}
    assert result.version_dir is not None
    version = read_version(result.version_dir)
    for variant in variants:
        spec = version.manifest.variants[variant]
        assert spec.data is not None and spec.data.file == f"{spec.file}.data"
        assert (result.version_dir / spec.data.file).stat().st_size == spec.data.size_bytes
        assert (result.version_dir / spec.file).stat().st_size < spec.data.size_bytes

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    layout = generation_layout(model.config, tokenizer)
    prompt = tokenizer("Acme was founded by John Smith in 1950")["input_ids"]
    settings = Settings(device="cpu", graph_cache_dir=tmp_path / "graphs")
    expected = greedy_torch(model, prompt, 16, layout.eos_token_id)
    for variant in ("fp32", "int8"):
        engine = ort_engine_factory(version, variant, settings)
        assert greedy_onnx(engine._session, layout, prompt, 16) == expected  # type: ignore[attr-defined]
    assert not list((tmp_path / "graphs").glob("*.onnx"))

    weights = result.version_dir / "model.onnx.data"
    corrupted = bytearray(weights.read_bytes())
    corrupted[100] ^= 0xFF
    weights.write_bytes(bytes(corrupted))
    with pytest.raises(RepositoryError, match="sha256 does not match"):
        read_version(result.version_dir)
    weights.unlink()
    with pytest.raises(RepositoryError, match="missing"):
        read_version(result.version_dir)


def test_a_draft_built_from_another_checkpoint_is_judged_against_it_and_the_student_keeps_its_own(
    tiny_llama_dir: Path, eval_text: Path, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """`--draft-from`: the draft variant comes from a copy of the student tuned to draft (here: other
    weights altogether), gated on its own checkpoint's answers, named in the manifest; the variant that
    answers stays the student's. A checkpoint of another tokenizer cannot draft and is refused."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export.pipeline import ExportError

    tuned = tmp_path / "tuned"  # the student's weights moved far enough to answer otherwise
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    torch.manual_seed(7)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.1)
    model.save_pretrained(tuned)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(tuned)
    pair = PairSpec(TeacherRef(name="llama-teacher", version=1), tiny_llama_dir, draft_from=tuned)
    result = export_model(
        tiny_llama_dir, "text-generation", "llama", tmp_path / "repo", ("fp32", "draft"), eval_data=eval_text,
        pair=pair,
    )  # fmt: skip
    assert {r.variant: r.problems for r in result.variants} == {"fp32": [], "draft": []}
    assert result.version_dir is not None
    manifest = read_version(result.version_dir).manifest
    assert manifest.variants["draft"].source == str(tuned) and manifest.variants["fp32"].source is None

    ids = np.array([[5, 17, 42, 7, 99, 3]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(6)[None]}
    feeds[LOGIT_POSITIONS] = every_position(1, 6)
    for layer in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = np.zeros((1, 2, 0, 16), dtype=np.float32)

    def top1(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(["logits"], feeds)[0][0].argmax(-1)

    def torch_top1(model_dir: Path) -> np.ndarray:
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        with torch.no_grad():
            return model(input_ids=torch.from_numpy(ids)).logits[0].numpy().argmax(-1)

    assert (top1(result.version_dir / "model.onnx") == torch_top1(tiny_llama_dir)).all()
    drafted = top1(result.version_dir / "model.draft.onnx")
    assert (drafted == torch_top1(tuned)).mean() > (drafted == torch_top1(tiny_llama_dir)).mean()

    other = PairSpec(pair.teacher, tiny_llama_dir, draft_from=tiny_models["text-generation"])  # GPT-2's BPE
    with pytest.raises(ExportError, match="not the model's tokenizer"):
        export_model(
            tiny_llama_dir, "text-generation", "llama", tmp_path / "repo", ("fp32", "draft"),
            eval_data=eval_text, pair=other,
        )  # fmt: skip
