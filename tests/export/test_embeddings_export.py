"""Sentence-embedding export on tiny BERTs saved as sentence-transformers directories (training.embeddings):
the ONNX graph pools and normalises as PyTorch's SentenceEncoder does (cosine >= 0.999 per sentence, and
the same numbers in fp32), with the pooling rule itself checked by hand; the manifest says what it gives; the
parity gate judges rows by cosine."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from typer.testing import CliRunner

from export.cli import app
from export.parity import BOUNDS, ParityReport, compare
from service.manifest import EmbeddingSpec, Manifest
from tests.tiny_models import CORPUS, tiny_bert_settings
from training.embeddings import Pooling, SentenceEncoder, encode
from training.tokenizer import SPECIAL_TOKENS, save_tokenizer, wordpiece_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Models this small run faster on one thread than on two contended ones (tests/training's too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TEXTS = [
    "I loved this film, it was wonderful.",
    "Who founded Acme?",
    "Acme was founded by John Smith in 1950 in the city of Springfield, a dull film about a city.",
    "film",
]
WINDOW = 32  # the SentenceEncoder's max_length: below the 64 positions, so the export must keep it


def fixed_vocabulary(texts: Iterable[str]) -> list[str]:
    """Every word of the texts, every letter and digit alone and as a ##piece: the same ids on every run
    (the WordPiece trainer breaks ties in hash order, so a learnt vocabulary, and with it every embedding,
    differed from process to process, and the retrieval tests' rankings with it)."""
    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]", text.lower())})
    chars = sorted(string.ascii_lowercase + string.digits)
    return list(dict.fromkeys([*SPECIAL_TOKENS, *words, *chars, *(f"##{c}" for c in chars)]))


def build_sentence_model(
    out: Path, pooling: Pooling = Pooling(), projection: int | None = None, seed: int = 0
) -> Path:
    """A 2-layer BertModel with a WordPiece tokenizer, saved by SentenceEncoder.save (modules.json,
    1_Pooling, [2_Dense], [Normalize]); `projection`: a Dense layer to that width."""
    tokenizer = wordpiece_tokenizer(fixed_vocabulary(CORPUS))
    torch.manual_seed(seed)
    backbone = BertModel(BertConfig(**tiny_bert_settings(len(tokenizer), positions=64, pad_token_id=0)))
    dense = None if projection is None else torch.nn.Linear(32, projection)
    SentenceEncoder(backbone, pooling, dense, max_length=WINDOW).save(out)
    save_tokenizer(tokenizer, out)
    return out


def write_sentences(out: Path) -> Path:
    """Eval lines as a plain text file, one sentence a line (training.data.sentences reads it)."""
    lines = sorted(set(CORPUS))
    out.write_text("\n".join(f"{a} {b}" for a in lines for b in lines) + "\n", encoding="utf-8")
    return out


def serving_repository(root: Path, embedders: dict[str, Path], classifiers: dict[str, Path]) -> Path:
    """`root/models` holding each sentence-embeddings model (gated on the sentences above) and each
    text-classification model, fp32, as the service tests serve them."""
    from export.pipeline import export_model

    repository = root / "models"
    sentences = write_sentences(root / "eval.txt")
    for task, models, eval_data in (
        ("sentence-embeddings", embedders, sentences),
        ("text-classification", classifiers, None),
    ):
        for name, model_dir in models.items():
            result = export_model(model_dir, task, name, repository, ("fp32",), eval_data=eval_data)  # type: ignore[arg-type]
            assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return repository


def export_cli(model_dir: Path, name: str, repository: Path, eval_data: Path, variants: str) -> Path:
    args = [str(model_dir), "--task", "sentence-embeddings", "--name", name, "--repository", str(repository)]
    result = CliRunner().invoke(app, [*args, "--eval-data", str(eval_data), "--variants", variants])
    assert result.exit_code == 0, result.output
    return repository / name / "1"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`mean`: mean + normalise (all-MiniLM-L6-v2's rule), fp32 and int8; `cls`: [CLS] projected to 16
    wide, not normalised, fp32."""
    root = tmp_path_factory.mktemp("embeddings-export")
    eval_data = write_sentences(root / "eval.txt")
    mean = build_sentence_model(root / "mean")
    cls = build_sentence_model(root / "cls", Pooling("cls", normalize=False), projection=16, seed=1)
    return {
        "mean": mean,
        "cls": cls,
        "mean_version": export_cli(mean, "embed", root / "models", eval_data, "fp32,int8"),
        "cls_version": export_cli(cls, "embed-cls", root / "models", eval_data, "fp32"),
    }


def onnx_outputs(path: Path, model_dir: Path, texts: list[str]) -> dict[str, np.ndarray]:
    """The graph's outputs for one right-padded batch of `texts`, tokenized by the HF tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=WINDOW, return_tensors="np")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def reference(model_dir: Path, texts: list[str]) -> np.ndarray:
    """PyTorch's SentenceEncoder, batched its own way (by length)."""
    model = SentenceEncoder.load(model_dir)
    return encode(model, AutoTokenizer.from_pretrained(model_dir), texts, batch_size=2).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_manifest_says_what_the_graph_gives(exported: dict[str, Path]) -> None:
    manifest = Manifest.model_validate_json((exported["mean_version"] / "manifest.json").read_text())
    assert manifest.task == "sentence-embeddings"
    assert manifest.embedding == EmbeddingSpec(
        dimensions=32,
        normalized=True,
        pooling="mean",
        output="sentence_embedding",
        pooled_output="pooled_embedding",
    )
    assert manifest.max_sequence_length == WINDOW  # sentence-transformers' max_seq_length, not 64
    # a fixed second axis: the service cuts outputs with a symbolic one to each text's length
    assert {o.name: o.shape for o in manifest.outputs} == {
        "sentence_embedding": ["batch_size", 32],
        "pooled_embedding": ["batch_size", 32],
    }
    assert set(manifest.variants) == {"fp32", "int8"}, manifest.rejected_variants
    for variant in manifest.variants.values():
        assert variant.parity["min_cosine"] >= 0.999 and variant.parity["eval_rows"] > 0

    cls = Manifest.model_validate_json((exported["cls_version"] / "manifest.json").read_text())
    assert cls.embedding == EmbeddingSpec(dimensions=16, normalized=False, pooling="cls")
    assert [o.name for o in cls.outputs] == ["sentence_embedding"]


def test_onnx_embeddings_match_pytorch_and_the_pooling_rule(exported: dict[str, Path]) -> None:
    model_dir, version = exported["mean"], exported["mean_version"]
    expected = reference(model_dir, TEXTS)
    got = onnx_outputs(version / "model.onnx", model_dir, TEXTS)
    np.testing.assert_allclose(got["sentence_embedding"], expected, atol=1e-5)
    assert cosines(got["sentence_embedding"], expected).min() >= 0.999
    int8 = onnx_outputs(version / "model.int8.onnx", model_dir, TEXTS)["sentence_embedding"]
    assert cosines(int8, expected).min() >= 0.999

    # the rule by hand, one text at a time (no padding at all): mean of the token vectors, then L2
    plain = BertModel.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for row, text in enumerate(TEXTS):
        with torch.no_grad():
            tokens = plain(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        mean = tokens.mean(0)
        np.testing.assert_allclose(got["pooled_embedding"][row], mean, atol=1e-5)
        np.testing.assert_allclose(got["sentence_embedding"][row], mean / np.linalg.norm(mean), atol=1e-5)


def test_a_projected_cls_model_without_normalisation_matches_pytorch(exported: dict[str, Path]) -> None:
    model_dir = exported["cls"]
    got = onnx_outputs(exported["cls_version"] / "model.onnx", model_dir, TEXTS)["sentence_embedding"]
    expected = reference(model_dir, TEXTS)
    assert got.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0)  # as pooled and projected, not normalised
    modules = json.loads((model_dir / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense"]


def test_the_gate_judges_embeddings_by_each_rows_cosine() -> None:
    rng = np.random.default_rng(0)
    expected = rng.normal(size=(4, 8)).astype(np.float32)
    feeds = {"attention_mask": np.ones((4, 3), dtype=np.int64)}
    turned = expected.copy()
    turned[2] = expected[2] + 0.2 * rng.normal(size=8).astype(np.float32)  # one row turned a little

    def report(got: np.ndarray) -> ParityReport:
        out = [{"sentence_embedding": got}]
        return compare(
            [{"sentence_embedding": expected}], out, [feeds], ["sentence_embedding"], False, 1, 0.999
        )

    same = report(expected * 1.0000001)
    assert same.min_cosine is not None and same.min_cosine > 0.99999 and same.top1_agreement == 1.0
    assert BOUNDS["int8"].failures(same) == []
    off = report(turned)
    assert off.min_cosine is not None and off.min_cosine < 0.999 and off.top1_agreement == 0.75
    (problem,) = BOUNDS["int8"].failures(off)
    assert problem.startswith("a row's cosine with PyTorch's is 0.9")
    assert "min_cosine" in off.as_dict()


def test_the_manifest_requires_the_embedding_spec_of_its_task(exported: dict[str, Path]) -> None:
    data = json.loads((exported["mean_version"] / "manifest.json").read_text())
    with pytest.raises(ValueError, match="'embedding'"):
        Manifest.model_validate({**data, "embedding": None})
    with pytest.raises(ValueError, match="not outputs of the graph"):
        Manifest.model_validate({**data, "embedding": {**data["embedding"], "output": "nope"}})
    with pytest.raises(ValueError, match="'embedding'"):
        Manifest.model_validate({**data, "task": "fill-mask", "special_tokens": {"mask": 4}})


def test_a_distilled_student_exports_with_its_distillation_record(tmp_path: Path) -> None:
    """`python -m training distill-embeddings` writes a directory export reads as it is; the manifest keeps
    the run's record (Spearman of both models)."""
    import random

    from tests.training.test_embeddings import sts_rows, write_stsb_tsv
    from training.cli import app as training_app

    teacher = build_sentence_model(tmp_path / "teacher")
    train = write_sentences(tmp_path / "train.txt")
    sts = write_stsb_tsv(tmp_path / "sts.tsv", sts_rows(random.Random(0), 20))
    args = [
        "distill-embeddings",
        "--teacher",
        str(teacher),
        "--train-text",
        str(train),
        "--eval-sts",
        str(sts),
    ]
    more = ["--out", str(tmp_path / "student"), "--layers", "1", "--max-steps", "2", "--threads", "1"]
    distilled = CliRunner().invoke(training_app, [*args, *more])
    assert distilled.exit_code == 0, distilled.output

    version = export_cli(tmp_path / "student", "student", tmp_path / "models", train, "fp32")
    manifest = Manifest.model_validate_json((version / "manifest.json").read_text())
    assert manifest.distillation is not None and manifest.distillation.metric == "spearman"
    assert manifest.distillation.teacher.params > manifest.distillation.student.params
    assert manifest.embedding is not None and manifest.embedding.dimensions == 32
    got = onnx_outputs(version / "model.onnx", tmp_path / "student", TEXTS)["sentence_embedding"]
    np.testing.assert_allclose(got, reference(tmp_path / "student", TEXTS), atol=1e-5)
