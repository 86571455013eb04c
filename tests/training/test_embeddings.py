"""Sentence-embedding distillation on a tiny BERT saved as a sentence-transformers directory (no hub):
the pooling rule read from its files and equal to the manual one, the student cut from the teacher's layers,
MSE that training lowers, Spearman with ties, retrieval, the data formats and the CLI end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase
from typer.testing import CliRunner

from tests.tiny_models import tiny_bert_settings
from training import distill_embeddings as de
from training.cli import app
from training.data.sentences import load_sentences, load_sts, squad_retrieval, sts_retrieval
from training.embedding_metrics import average_ranks, retrieval, spearman
from training.embeddings import Pooling, SentenceEncoder, encode, pool, read_pooling
from training.losses import embedding_loss
from training.recipes import TrainConfig
from training.runs import fast_tokenizer
from training.tokenizer import save_tokenizer, train_wordpiece
from training.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")

VOCABULARY = (
    "the a man woman dog cat plays runs eats reads sings guitar ball book song fast slowly "
    "in park house river city red blue small big old young happy sad"
)
WORDS = VOCABULARY.split()


def sentence(rng: random.Random, length: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(length))


def sts_rows(rng: random.Random, n: int) -> list[tuple[str, str, float]]:
    """Pairs whose score is 5 x the share of words kept: something a random encoder still ranks a little."""
    rows = []
    for _ in range(n):
        first = sentence(rng, rng.randint(4, 9)).split()
        kept = rng.randint(0, len(first))
        second = first[:kept] + [rng.choice(WORDS) for _ in range(len(first) - kept)]
        rows.append((" ".join(first), " ".join(second), round(5 * kept / len(first), 3)))
    return rows


def write_stsb_tsv(path: Path, rows: list[tuple[str, str, float]]) -> Path:
    """GLUE STS-B's layout: ten tab-separated columns, unquoted."""
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    lines = [header] + [
        f"{i}\tmain\tgen\t2026\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score:.3f}"
        for i, (a, b, score) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_squad(path: Path, rng: random.Random) -> Path:
    """Two articles of three paragraphs; each question repeats words of its own paragraph."""
    articles: list[dict[str, object]] = []
    for a in range(2):
        paragraphs: list[dict[str, object]] = []
        for _ in range(3):
            context = sentence(rng, 12)
            words = context.split()
            qas = [
                {
                    "id": f"{a}-{len(paragraphs)}-{q}",
                    "question": " ".join(words[q : q + 5]),
                    "answers": [{"text": words[0], "answer_start": 0}],
                }
                for q in range(2)
            ]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"article {a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 4-layer BertModel with sentence-transformers' files (mean + normalize, as all-MiniLM-L6-v2), its
    WordPiece tokenizer, training sentences, an STS-B style TSV and a SQuAD file."""
    root = tmp_path_factory.mktemp("embeddings")
    rng = random.Random(0)
    sentences = [sentence(rng, rng.randint(3, 12)) for _ in range(200)]
    tokenizer = train_wordpiece(sentences, vocab_size=200)
    torch.manual_seed(0)
    # A wide initialisation: layers that change their input, so a cut student has something to learn.
    settings = tiny_bert_settings(len(tokenizer), layers=4, pad_token_id=0, initializer_range=0.5)
    backbone = BertModel(BertConfig(**settings))
    SentenceEncoder(backbone, Pooling("mean", normalize=True), max_length=64).save(root / "teacher")
    save_tokenizer(tokenizer, root / "teacher")
    (root / "train.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return {
        "root": root,
        "teacher": root / "teacher",
        "train": root / "train.txt",
        "sts": write_stsb_tsv(root / "sts.tsv", sts_rows(rng, 40)),
        "squad": write_squad(root / "squad.json", rng),
    }


# --------------------------------------------------------------------------- pooling and files


def test_pooling_is_read_from_the_directory_and_equals_the_manual_rule(setup: dict[str, Path]) -> None:
    modules = json.loads((setup["teacher"] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((setup["teacher"] / "1_Pooling" / "config.json").read_text())[
        "pooling_mode_mean_tokens"
    ]
    assert read_pooling(setup["teacher"]) == Pooling("mean", normalize=True)

    model = SentenceEncoder.load(setup["teacher"])
    tokenizer = fast_tokenizer(setup["teacher"])
    texts = ["the dog runs", "a small old cat reads a big blue book in the park", "sad"]
    got = encode(model, tokenizer, texts, batch_size=2)

    plain = BertModel.from_pretrained(setup["teacher"]).eval()
    for text, vector in zip(texts, got, strict=True):  # one sentence at a time: no padding at all
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            tokens = plain(**ids).last_hidden_state[0]
        mean = tokens.sum(0) / tokens.size(0)
        assert torch.allclose(vector, mean / mean.norm(), atol=1e-5)


def test_pool_ignores_padding_in_every_mode() -> None:
    hidden = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    padded = hidden.clone()
    padded[0, 2:] = 100.0  # whatever padding holds must not count
    assert torch.allclose(pool(padded, mask, "mean")[0], hidden[0, :2].mean(0))
    assert torch.allclose(pool(padded, mask, "max")[0], hidden[0, :2].max(0).values)
    assert torch.equal(pool(padded, mask, "cls"), hidden[:, 0])


def test_a_rule_round_trips_and_a_plain_hf_directory_gets_mean_normalize(tmp_path: Path) -> None:
    backbone = BertModel(BertConfig(**tiny_bert_settings(50, layers=1)))
    SentenceEncoder(backbone, Pooling("cls", normalize=False)).save(tmp_path / "cls")
    assert read_pooling(tmp_path / "cls") == Pooling("cls", normalize=False)
    assert SentenceEncoder.load(tmp_path / "cls").pooling == Pooling("cls", normalize=False)
    with pytest.raises(ValueError, match="cannot be read as"):
        SentenceEncoder.load(tmp_path / "cls", Pooling("mean"))

    backbone.save_pretrained(tmp_path / "plain")
    assert read_pooling(tmp_path / "plain") is None
    assert SentenceEncoder.load(tmp_path / "plain").pooling == Pooling("mean", normalize=True)
    assert SentenceEncoder.load(tmp_path / "plain", Pooling("max")).pooling == Pooling("max")

    config = tmp_path / "cls" / "1_Pooling" / "config.json"
    flags = json.loads(config.read_text())
    config.write_text(json.dumps({**flags, "pooling_mode_mean_tokens": True}))
    with pytest.raises(ValueError, match="not exactly one"):
        read_pooling(tmp_path / "cls")


# --------------------------------------------------------------------------- the student


def layers(model: SentenceEncoder) -> nn.ModuleList:
    stack = model.backbone.get_submodule("encoder.layer")
    assert isinstance(stack, nn.ModuleList)
    return stack


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    other = b.state_dict()
    return all(torch.equal(value, other[name]) for name, value in a.state_dict().items())


def test_the_student_is_cut_from_the_teachers_layers(setup: dict[str, Path]) -> None:
    teacher = SentenceEncoder.load(setup["teacher"])
    student, layer_map = de.cut_encoder(teacher, de.EmbeddingDistillConfig(layers=2))
    assert layer_map == [0, 3]
    assert student.pooling == teacher.pooling and student.projection is None
    assert len(layers(student)) == 2
    for i, t in enumerate(layer_map):
        assert same_weights(layers(student)[i], layers(teacher)[t])
    embeddings = "embeddings"
    assert same_weights(
        student.backbone.get_submodule(embeddings), teacher.backbone.get_submodule(embeddings)
    )
    assert not same_weights(layers(student)[1], layers(teacher)[1])

    chosen, _ = de.cut_encoder(teacher, de.EmbeddingDistillConfig(layers=2, layer_map=(1, 2)))
    assert same_weights(layers(chosen)[0], layers(teacher)[1])
    assert same_weights(layers(chosen)[1], layers(teacher)[2])


def test_a_narrower_student_projects_to_the_teachers_width_and_saves_it(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    teacher = SentenceEncoder.load(setup["teacher"])
    student, layer_map = de.cut_encoder(teacher, de.EmbeddingDistillConfig(layers=1, hidden_size=16))
    assert layer_map is None and student.width == 16 and student.dim == teacher.dim == 32
    tokenizer = fast_tokenizer(setup["teacher"])
    texts = ["the dog runs in the park", "a cat"]
    before = encode(student, tokenizer, texts)
    assert before.shape == (2, 32) and torch.allclose(before.norm(dim=-1), torch.ones(2))
    student.save(tmp_path / "narrow")
    kinds = [
        m["type"].rsplit(".", 1)[-1] for m in json.loads((tmp_path / "narrow" / "modules.json").read_text())
    ]
    assert kinds == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert torch.allclose(
        encode(SentenceEncoder.load(tmp_path / "narrow"), tokenizer, texts), before, atol=1e-6
    )


# --------------------------------------------------------------------------- training


def _mse(
    student: SentenceEncoder, targets: torch.Tensor, tokenizer: PreTrainedTokenizerBase, sentences: list[str]
) -> float:
    return float(embedding_loss(encode(student, tokenizer, sentences), targets).mse)


@pytest.mark.parametrize(("alpha_hidden", "hidden_size"), [(0.0, None), (0.1, None), (0.1, 16)])
def test_a_few_steps_lower_the_mse_to_the_teacher(
    setup: dict[str, Path], alpha_hidden: float, hidden_size: int | None
) -> None:
    """From cached teacher embeddings; with the teacher run every step to align hidden states too; and a
    narrower student whose projections (embedding and hidden) learn with it."""
    teacher = SentenceEncoder.load(setup["teacher"]).eval()
    tokenizer = fast_tokenizer(setup["teacher"])
    sentences = load_sentences(setup["train"]).lines[:64]
    targets = encode(teacher, tokenizer, sentences)
    config = de.EmbeddingDistillConfig(layers=1, hidden_size=hidden_size, alpha_hidden=alpha_hidden)
    student, layer_map = de.cut_encoder(teacher, config)
    before = _mse(student, targets, tokenizer, sentences)
    cached = None if alpha_hidden else targets
    loader = de.sentence_loader(sentences, cached, tokenizer, batch_size=16, max_length=32, seed=0)
    alignment = (
        de.make_alignment(student.backbone, teacher.backbone, layer_map, "mse") if alpha_hidden else None
    )
    with de.trains_with(student, alignment):
        history = train(
            student,
            loader,
            de.embedding_step(config, alignment),
            TrainConfig(epochs=6, lr=3e-3, batch_size=16, warmup_ratio=0.0, dropout=0.0),
            teacher=teacher if alpha_hidden else None,
        )
    after = _mse(student, targets, tokenizer, sentences)
    assert after < 0.8 * before
    assert history.steps[-1]["loss"] < history.steps[0]["loss"]
    assert not hasattr(student, "hidden_projection")  # the alignment's projection is not saved


def test_embedding_loss_terms() -> None:
    a = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=-1)
    b = F.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), dim=-1)
    terms = embedding_loss(a, b, alpha_mse=1.0, alpha_cosine=2.0)
    assert float(terms.mse) == pytest.approx(0.5)  # (0 + 0 + 1 + 1) / 4
    assert float(terms.cosine) == pytest.approx(0.5)  # (0 + 1) / 2
    assert float(terms.total) == pytest.approx(1.5)


# --------------------------------------------------------------------------- metrics


def test_spearman_with_ties_matches_the_hand_computed_value() -> None:
    assert average_ranks(torch.tensor([10.0, 20.0, 10.0, 30.0, 20.0, 20.0])).tolist() == [
        1.5,
        4.0,
        1.5,
        6.0,
        4.0,
        4.0,
    ]
    # ranks [1, 2.5, 2.5, 4] and [1, 3, 2, 4]: deviations (-1.5, 0, 0, 1.5) and (-1.5, .5, -.5, 1.5),
    # rho = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    assert spearman([1.0, 2.0, 2.0, 3.0], [0.1, 0.7, 0.4, 0.9]) == pytest.approx(3 / 10**0.5)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) != spearman([1, 1, 1], [1, 2, 3])  # NaN: constant scores


def test_retrieval_agreement_and_recall() -> None:
    candidates = torch.eye(3)
    teacher_queries = torch.tensor([[1.0, 0.1, 0.0], [0.0, 1.0, 0.2], [0.3, 0.0, 1.0]])
    student_queries = torch.tensor([[1.0, 0.1, 0.0], [0.0, 0.2, 1.0], [0.3, 0.0, 1.0]])
    gold = torch.tensor([0, 1, -1])
    result = retrieval((student_queries, candidates), (teacher_queries, candidates), gold)
    assert result["top1_agreement"] == pytest.approx(2 / 3)
    assert result["teacher_recall_at_1"] == 1.0 and result["student_recall_at_1"] == 0.5
    only_first = torch.tensor([[True, False, False]] * 3)
    assert retrieval((student_queries, candidates), (teacher_queries, candidates), None, only_first)[
        "top1_agreement"
    ] == pytest.approx(1.0)


def test_mixed_retrieval_reads_the_students_queries_against_the_teachers_candidates() -> None:
    teacher_queries = torch.tensor([[1.0, 0.1, 0.0], [0.0, 1.0, 0.2], [0.3, 0.0, 1.0]])
    student_queries = torch.tensor([[1.0, 0.1, 0.0], [0.0, 0.2, 1.0], [0.3, 0.0, 1.0]])
    teacher_candidates = torch.eye(3)
    student_candidates = torch.eye(3)[[1, 0, 2]]  # the student files the first two candidates swapped
    gold = torch.tensor([0, 1, -1])
    result = retrieval((student_queries, student_candidates), (teacher_queries, teacher_candidates), gold)
    # tops: student [1, 2, 2], teacher [0, 1, 2], student queries against the teacher's candidates [0, 2, 2]
    assert result["top1_agreement"] == pytest.approx(1 / 3)
    assert result["mixed_top1_agreement"] == pytest.approx(2 / 3)
    assert result["student_recall_at_1"] == 0.0 and result["mixed_recall_at_1"] == 0.5
    assert result["teacher_recall_at_1"] == 1.0


# --------------------------------------------------------------------------- data


def test_sts_files_in_glue_tsv_and_jsonl(setup: dict[str, Path], tmp_path: Path) -> None:
    sts = load_sts(setup["sts"])
    assert len(sts.scores) == 40 and all(0 <= s <= 5 for s in sts.scores)
    quoted = write_stsb_tsv(tmp_path / "q.tsv", [('a "quoted word', "b", 1.0), ("c", "d", 4.5)])
    assert load_sts(quoted).first[0] == 'a "quoted word'  # GLUE's stray quotes are text, not quoting
    rows = [
        {"sentence1": "x y", "sentence2": "x", "label": 0.5},
        {"sentence1": "z", "sentence2": "z", "label": 1},
    ]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert load_sts(tmp_path / "s.jsonl").scores == [0.5, 1.0]
    retrieval_set = sts_retrieval(load_sts(tmp_path / "s.jsonl"))
    assert retrieval_set.candidates == ["x", "z"] and retrieval_set.gold == [-1, 1]


def test_sentences_from_text_and_sst2_style_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one line\n\ntwo line\none line\n")
    assert load_sentences(tmp_path / "a.txt").lines == ["one line", "two line"]
    (tmp_path / "b.tsv").write_text("sentence\tlabel\nit 's \"good\t1\nbad\t0\n")
    assert load_sentences(tmp_path / "b.tsv").lines == ["it 's \"good", "bad"]
    (tmp_path / "c.jsonl").write_text('{"text": "hi", "label": "positive"}\n')
    assert load_sentences(tmp_path / "c.jsonl").lines == ["hi"]


def test_squad_questions_retrieve_within_their_article(setup: dict[str, Path]) -> None:
    data = squad_retrieval(setup["squad"])
    assert len(data.queries) == 12 and len(data.candidates) == 6
    assert data.candidate_groups == [0, 0, 0, 1, 1, 1]
    assert all(data.candidate_groups[g] == q for g, q in zip(data.gold, data.query_groups, strict=True))


# --------------------------------------------------------------------------- the CLI


def test_the_cli_distils_scores_and_writes_a_sentence_transformers_student(setup: dict[str, Path]) -> None:
    out, cache = setup["root"] / "student", setup["root"] / "teacher.pt"
    args = [
        "distill-embeddings",
        "--teacher",
        str(setup["teacher"]),
        "--train-text",
        str(setup["train"]),
        "--eval-sts",
        str(setup["sts"]),
        "--eval-retrieval",
        str(setup["squad"]),
        "--out",
        str(out),
        "--layers",
        "2",
        "--max-steps",
        "4",
        "--batch-size",
        "32",
        "--lr",
        "1e-3",
        "--teacher-cache",
        str(cache),
        "--threads",
        "1",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "distill_report.json").read_text())
    assert report["task"] == "sentence-embeddings" and report["metric"] == "spearman"
    assert report["eval"]["examples"] == 40 and report["train"]["examples"] == 200
    assert report["student"]["layers"] == 2 and report["student"]["layer_map"] == [0, 3]
    assert report["teacher"]["params"] > report["student"]["params"]
    assert -1 <= report["student"]["score"] <= 1 and -1 <= report["teacher"]["score"] <= 1
    assert report["teacher"]["pooling"] == {"mode": "mean", "normalize": True}
    assert 0 <= report["agreement"] <= 1
    assert report["agreement"] == report["retrieval"]["squad"]["top1_agreement"]
    assert set(report["retrieval"]) == {"sts", "squad"}
    assert report["speed"]["sentences_per_s"]["student"] > 0 and report["history"]
    assert (out / "distill_report.md").is_file() and (out / "tokenizer.json").is_file()
    assert read_pooling(out) == Pooling("mean", normalize=True)
    assert cache.is_file()

    student = SentenceEncoder.load(out)
    assert len(layers(student)) == 2 and student.max_length == 64

    again = CliRunner().invoke(app, [*args[:10], str(setup["root"] / "again"), *args[11:]])
    assert again.exit_code == 0, again.output
    assert "teacher embeddings:" not in again.output  # read from the cache, not computed again


def test_the_cli_says_what_is_wrong_with_a_bad_sts_file(setup: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\nx\ty\n")
    args = ["distill-embeddings", "--teacher", str(setup["teacher"]), "--train-text", str(setup["train"])]
    result = CliRunner().invoke(app, [*args, "--eval-sts", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "STS set needs two pairs" in result.output or "score" in result.output
