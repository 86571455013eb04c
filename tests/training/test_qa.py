"""Question answering: windows and labels round-trip to the answer text, span search, SQuAD metrics, steps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

from common.spans import NOT_CONTEXT, Span, answer_text, best_span, offsets_array
from training import qa, steps
from training.data.demo import write_demo_data
from training.data.types import Answer, QAExample
from training.recipes import DistillConfig, TrainConfig
from training.squad_metrics import exact_match, f1, normalize_answer, squad_scores
from training.tokenizer import train_wordpiece
from training.trainer import train

# Windows for the long word contexts: several per context, overlaps longer than any two-word answer has
# characters (so tokens, whatever vocabulary the tokenizer learnt).
WINDOW, STRIDE = 48, 14
PROSE = (
    "the river city was founded by a farmer near the old harbor and its market grew every year "
    "until the station opened with a library garden school park village cinema bridge tower"
)
WORDS = PROSE.split()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[qa.QAData, qa.QAData]:
    files = write_demo_data(tmp_path_factory.mktemp("data"), n_classification=10, n_qa=160, n_text_lines=10)
    return qa.load_data(files.qa_train), qa.load_data(files.qa_eval)


@pytest.fixture(scope="module")
def tokenizer(demo: tuple[qa.QAData, qa.QAData]) -> BertTokenizerFast:
    return train_wordpiece([*qa.texts(demo[0]), PROSE], vocab_size=600)


def _model(tokenizer: BertTokenizerFast, seed: int = 0, layers: int = 2) -> BertForQuestionAnswering:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    return BertForQuestionAnswering(config)


def _labelled_text(example: QAExample, window: qa.Window) -> str:
    start, end = window.offsets[window.start], window.offsets[window.end]
    assert NOT_CONTEXT not in (start[0], end[0]), "a labelled token outside the context"
    return example.context[start[0] : end[1]]


def _context(window: qa.Window) -> np.ndarray:
    return window.offsets[window.offsets[:, 0] != NOT_CONTEXT]


def _context_chars(window: qa.Window) -> tuple[int, int]:
    context = _context(window)
    return int(context[0, 0]), int(context[-1, 1])


def _word_examples(n_words: int, answer_words: int) -> qa.QAData:
    """One long context; one question per answer of `answer_words` consecutive words, at every position."""
    context = " ".join(WORDS[i % len(WORDS)] for i in range(n_words)).capitalize() + "."
    starts = [0, *(i + 1 for i, ch in enumerate(context) if ch == " ")]
    examples = []
    for w in range(n_words - answer_words + 1):
        end = starts[w + answer_words] - 1 if w + answer_words < n_words else len(context) - 1
        text = context[starts[w] : end]
        examples.append(
            QAExample(f"q{w}", "t", f"which words come at {w}?", context, [Answer(text, starts[w])])
        )
    return qa.QAData(examples, "memory")


# --------------------------------------------------------------------------- windows and labels


def test_labels_round_trip_to_the_answer_text(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    data = demo[0]
    windows = qa.encode(data, tokenizer, max_length=128)
    assert len(windows) == len(data.examples)  # demo contexts fit one 128-token window
    for window in windows:
        example = data.examples[window.example]
        assert window.start != qa.CLS_INDEX
        assert _labelled_text(example, window) == example.answers[0].text


@pytest.mark.parametrize("answer_words", [1, 2])
def test_long_contexts_split_into_overlapping_windows(
    tokenizer: BertTokenizerFast, answer_words: int
) -> None:
    stride = STRIDE  # longer than any answer here (a longer one may be wholly inside no window)
    data = _word_examples(n_words=70, answer_words=answer_words)
    windows = qa.encode(data, tokenizer, max_length=WINDOW, doc_stride=stride)
    by_example = {i: [w for w in windows if w.example == i] for i in range(len(data.examples))}

    first = by_example[0]
    assert len(first) >= 3
    for before, after in itertools.pairwise(first):  # consecutive windows share exactly `stride` tokens
        assert np.array_equal(_context(after)[:stride], _context(before)[-stride:])

    in_overlap = only_later = 0
    for i, example in enumerate(data.examples):
        answer = (example.answers[0].start, example.answers[0].start + len(example.answers[0].text))
        holding = []
        for index, window in enumerate(by_example[i]):
            begin, end = _context_chars(window)
            if begin <= answer[0] and answer[1] <= end:
                assert _labelled_text(example, window) == example.answers[0].text
                holding.append(index)
            else:  # not in this window, or only partly
                assert (window.start, window.end) == (qa.CLS_INDEX, qa.CLS_INDEX)
        assert holding, f"{example.id}: no window holds the answer"
        in_overlap += len(holding) > 1
        only_later += holding[0] > 0
    assert in_overlap > 0 and only_later > 0


def test_partly_covered_answers_are_labelled_cls(tokenizer: BertTokenizerFast) -> None:
    data = _word_examples(n_words=70, answer_words=5)
    windows = qa.encode(data, tokenizer, max_length=32, doc_stride=6)
    partly = 0
    for window in windows:
        answer = data.examples[window.example].answers[0]
        begin, end = _context_chars(window)
        inside = [begin <= c < end for c in (answer.start, answer.start + len(answer.text) - 1)]
        if any(inside) and not all(inside):
            partly += 1
            assert (window.start, window.end) == (qa.CLS_INDEX, qa.CLS_INDEX)
    assert partly > 0


def test_answer_whitespace_is_not_part_of_the_span(tokenizer: BertTokenizerFast) -> None:
    context = "The city was founded by a farmer near the harbor."
    example = QAExample("q", "t", "who founded it?", context, [Answer(" a farmer ", 23)])
    [window] = qa.encode(qa.QAData([example], "memory"), tokenizer, max_length=64)
    assert _labelled_text(example, window) == "a farmer"


def test_a_question_leaving_no_room_for_context_fails_clearly(tokenizer: BertTokenizerFast) -> None:
    example = QAExample("long", "t", "which river " * 12, "the river city", [Answer("river", 4)])
    with pytest.raises(ValueError, match=r"'long'.*doc_stride"):
        qa.encode(qa.QAData([example], "memory"), tokenizer, max_length=32, doc_stride=8)


def test_loader_pads_each_batch_and_carries_positions(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    loader = qa.make_loader(
        demo[0], tokenizer, None, batch_size=8, max_length=64, shuffle=True, doc_stride=16
    )
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape and batch["input_ids"].size(0) == 8
    lengths = batch["attention_mask"].sum(1)
    assert int(lengths.max()) == batch["input_ids"].size(1)
    assert bool((batch["end_positions"] >= batch["start_positions"]).all())
    assert bool((batch["end_positions"] < lengths).all())


def test_data_helpers(demo: tuple[qa.QAData, qa.QAData]) -> None:
    data = demo[1]
    assert qa.label_names(data) == []
    contexts = {e.context for e in data.examples}
    assert len(qa.texts(data)) == len(data.examples) + len(contexts)


# --------------------------------------------------------------------------- span search


def _offsets(*windows: list[tuple[int, int] | None]) -> np.ndarray:
    return offsets_array(list(windows))


def test_best_span_takes_the_best_valid_pair_across_windows() -> None:
    # window 0: [CLS] q q [SEP] c0 c1 c2 [SEP]; window 1 (overlapping): [CLS] q q [SEP] c2 c3 c4 [SEP]
    q = [None, None, None, None]
    offsets = _offsets([*q, (0, 3), (4, 9), (10, 14), None], [*q, (10, 14), (15, 20), (21, 25), None])
    start = np.array([[9.0, 9, 9, 0, 1, 2, 0, 9], [9.0, 9, 9, 0, 0, 3, 1, 9]])  # highest: not context
    end = np.array([[9.0, 9, 9, 0, 0, 2, 1, 9], [9.0, 9, 9, 0, 0, 0, 2.5, 9]])
    span = best_span(start, end, offsets)
    assert span == Span(window=1, start_token=5, end_token=6, start_char=15, end_char=25, score=5.5)
    assert answer_text("abc defgh ijkl mnopq rstu", span) == "mnopq rstu"


def test_best_span_never_ends_before_it_starts_or_runs_too_long() -> None:
    offsets = _offsets([None, (0, 1), (2, 3), (4, 5), (6, 7), None])
    start = np.array([[0.0, -1, 0, 1, 9, 0]])
    end = np.array([[0.0, 9, 0, 2, 0, 0]])  # start 4 -> end 1 would score 18
    assert best_span(start, end, offsets) == Span(0, 4, 4, 6, 7, 9.0)

    start = np.array([[0.0, 5, 0, 0, 0, 0]])
    end = np.array([[0.0, 0, 0, 0, 5, 0]])  # start 1 -> end 4 is 4 tokens long
    assert _tokens(best_span(start, end, offsets, max_answer_length=4)) == (1, 4)
    assert _tokens(best_span(start, end, offsets, max_answer_length=3)) == (1, 1)  # ties: shortest


def _tokens(span: Span | None) -> tuple[int, int]:
    assert span is not None
    return span.start_token, span.end_token


def test_best_span_without_context_is_none() -> None:
    offsets = _offsets([None, None, None])
    assert best_span(np.zeros((1, 3)), np.zeros((1, 3)), offsets) is None
    assert answer_text("anything", None) == ""


def test_best_span_matches_brute_force_on_random_logits() -> None:
    """The reference a numpy reimplementation (the service) can be checked against, pair by pair."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        windows, length, limit = (int(rng.integers(low, high)) for low, high in ((1, 4), (4, 20), (1, 6)))
        start, end = rng.normal(size=(windows, length)), rng.normal(size=(windows, length))
        offsets = np.full((windows, length, 2), NOT_CONTEXT)
        for w in range(windows):
            for t in range(int(rng.integers(1, 3)), length - int(rng.integers(1, 3))):
                offsets[w, t] = (3 * t, 3 * t + 2)
        best = max(
            (start[w, i] + end[w, j], w, i, j)
            for w in range(windows)
            for i in range(length)
            for j in range(i, min(length, i + limit))
            if offsets[w, i, 0] != NOT_CONTEXT and offsets[w, j, 0] != NOT_CONTEXT
        )
        span = best_span(start, end, offsets, max_answer_length=limit)
        assert span is not None and (span.window, span.start_token, span.end_token) == best[1:]
        assert span.score == pytest.approx(best[0])


def test_oracle_logits_recover_every_gold_answer(tokenizer: BertTokenizerFast) -> None:
    """Labels -> logits -> best span over the windows -> text: the whole post-processing path."""
    data = _word_examples(n_words=70, answer_words=2)
    windows = qa.encode(data, tokenizer, max_length=WINDOW, doc_stride=STRIDE)
    logits = []
    for window in windows:
        start, end = np.zeros(len(window.offsets)), np.zeros(len(window.offsets))
        if window.start != qa.CLS_INDEX:
            start[window.start], end[window.end] = 10.0, 10.0
        logits.append((start, end))
    spans = qa.spans_from_logits(windows, logits, len(data.examples))
    predictions = [answer_text(e.context, s) for e, s in zip(data.examples, spans, strict=True)]
    assert predictions == [e.answers[0].text for e in data.examples]
    assert squad_scores(predictions, [[a.text for a in e.answers] for e in data.examples]) == (1.0, 1.0)


# --------------------------------------------------------------------------- SQuAD metrics


def test_squad_normalisation_and_exact_match() -> None:
    assert normalize_answer("  The  Eiffel-Tower, in a  city!") == "eiffeltower in city"
    assert exact_match("the Eiffel Tower", "Eiffel Tower!") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0


def test_squad_f1_counts_shared_words() -> None:
    assert f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)  # p 2/4, r 2/2
    assert f1("tower tower", "tower") == pytest.approx(2 / 3)  # p 1/2, r 1/1: a bag, not a set
    assert f1("", "Eiffel Tower") == 0.0 and f1("the", "a") == 0.0  # nothing left after normalising
    scores = squad_scores(
        ["Eiffel Tower in Paris", "1889", "no"],
        [["the Eiffel Tower", "Eiffel Tower in Paris."], ["1887"], []],
    )
    assert scores.exact_match == pytest.approx(1 / 2) and scores.f1 == pytest.approx(1 / 2)  # 3rd unscored


# --------------------------------------------------------------------------- steps


def test_teacher_loss_falls_on_the_demo_data(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    train_data, eval_data = demo
    model = _model(tokenizer)
    loader = qa.make_loader(train_data, tokenizer, None, batch_size=16, max_length=64, shuffle=True)
    cfg = TrainConfig(epochs=4, lr=3e-3, batch_size=16, warmup_ratio=0.0, seed=0)
    history = train(model, loader, qa.teacher_step, cfg, description="test")

    losses = [s["loss"] for s in history.steps]
    assert len(losses) == 4 * len(loader)
    assert sum(losses[-3:]) / 3 < 0.75 * sum(losses[:3]) / 3
    metrics = qa.evaluate(model, eval_data, tokenizer, max_length=64)
    assert set(metrics) == {"f1", "exact_match"} and 0.0 <= metrics["exact_match"] <= metrics["f1"] <= 1.0
    assert qa.agreement(model, model, eval_data, tokenizer, max_length=64) == 1.0


def test_teacher_loss_is_bert_qa_loss(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    model = _model(tokenizer).eval()
    batch = qa.collate(qa.encode(demo[0], tokenizer, max_length=64)[:1], pad_token_id=0)  # no padding
    with torch.no_grad():
        assert float(qa.teacher_step(model, batch).total) == pytest.approx(float(model(**batch).loss))


def test_padding_does_not_change_the_loss(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    model = _model(tokenizer).eval()
    window = qa.encode(demo[0], tokenizer, max_length=64)[0]
    batch = qa.collate([window], pad_token_id=0)
    padded = {k: torch.nn.functional.pad(v, (0, 7)) if v.dim() == 2 else v for k, v in batch.items()}
    with torch.no_grad():
        alone, with_padding = (float(qa.teacher_step(model, b).total) for b in (batch, padded))
    assert with_padding == pytest.approx(alone)


def test_distill_step_gives_finite_losses_and_gradients(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    teacher, student = _model(tokenizer, seed=0), _model(tokenizer, seed=1, layers=1)
    teacher.requires_grad_(False).eval()
    batch = next(iter(qa.make_loader(demo[0], tokenizer, None, batch_size=8, max_length=64, shuffle=True)))
    step = qa.distill_step(DistillConfig(temperature=2.0, alpha_kd=0.5, alpha_hard=0.5))
    terms = step(student, batch, teacher)
    total, kd, hard = (float(t.detach()) for t in (terms.total, terms.kd, terms.hard))
    assert all(math.isfinite(x) for x in (total, kd, hard)) and kd > 0
    assert total == pytest.approx(0.5 * kd + 0.5 * hard)
    terms.total.backward()
    grads = [p.grad for p in student.parameters() if p.requires_grad]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads if g is not None)
    with pytest.raises(ValueError, match="teacher"):
        qa.distill_step(DistillConfig())(student, batch, None)


def test_distill_step_aligns_hidden_states(
    demo: tuple[qa.QAData, qa.QAData], tokenizer: BertTokenizerFast
) -> None:
    teacher, student = _model(tokenizer, seed=0), _model(tokenizer, seed=1, layers=1)
    batch = next(iter(qa.make_loader(demo[0], tokenizer, None, batch_size=4, max_length=64, shuffle=True)))
    alignment = steps.make_alignment(student, teacher, [1], "cosine")
    terms = qa.distill_step(DistillConfig(alpha_hidden=1.0), alignment)(student, batch, teacher.eval())
    assert terms.hidden is not None and math.isfinite(float(terms.hidden.detach()))
