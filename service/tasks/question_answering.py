"""Extractive question answering: question + context -> answer spans, as characters of the context.

The context is split into overlapping windows that batch like texts. Retrieve, then read: a question with
`passages` instead of one context is answered from the passages a sentence-embeddings model ranks nearest
(service.tasks.retrieval), each read as a context; the answer names its passage (/v1 only).

`POST /v1/qa`; v2: QUESTION, CONTEXT BYTES [b] -> ANSWER BYTES [b], SCORE FP32 [b], START, END INT64 [b]
(character offsets: CONTEXT[START:END] == ANSWER), MODEL BYTES [b] (the model that answered); parameters
max_answer_length, doc_stride, handle_impossible_answer as in /v1/qa.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from common.spans import null_score, offsets_array, span_probabilities, top_spans
from service.exchange import Exchange
from service.tasks import retrieval
from service.tasks.common import (
    answered_by,
    check_chars,
    passed,
    run_all,
    strings,
    tokenizing,
    validated,
)
from service.tasks.contract import (
    ANSWERED_BY,
    CascadeRequest,
    Collaborators,
    Endpoint,
    InvalidInputError,
    ServedTask,
    V2Interface,
    V2Job,
    tensor,
)
from service.tokenization import EncodedText

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import ServedModel

NAME = "question-answering"
TOP_K_PASSAGES = 3  # passages read when a request does not say


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(..., min_length=1, pattern=r"\S", description="The question.")
    context: str = Field(..., min_length=1, pattern=r"\S", description="The text that holds the answer.")


class QARequest(CascadeRequest):
    """One question (`question` + `context`, or + `passages` to retrieve from) or several (`inputs`: a list
    of question/context pairs)."""

    question: str | None = Field(None, min_length=1, pattern=r"\S", examples=["Who founded Acme?"])
    context: str | None = Field(
        None, min_length=1, pattern=r"\S", examples=["Acme was founded by Ada Smith in 1950 in Springfield."]
    )
    inputs: list[QAItem] | None = Field(None, min_length=1, description="Several question/context pairs.")
    top_k: int = Field(1, ge=1, le=20, description="How many answers per question, best first.")
    max_answer_length: int = Field(30, ge=1, le=512, description="Longest answer, in tokens.")
    handle_impossible_answer: bool = Field(False, description="Allow an empty answer when none fits.")
    doc_stride: int | None = Field(None, ge=1, description="Overlap between context windows, in tokens.")
    passages: list[str] | None = Field(
        None,
        description="Texts to answer from instead of one context: the passages nearest the question (by "
        "cosine of sentence embeddings) are read, and the answer names its passage.",
        examples=[["Acme was founded by Ada Smith in 1950.", "Springfield is a city."]],
    )
    top_k_passages: int | None = Field(
        None,
        ge=1,
        description=f"How many passages, nearest first, the QA model reads; default {TOP_K_PASSAGES}.",
    )
    embedding_model: str | None = Field(
        None, description="The sentence-embeddings model that ranks passages; default: the first served."
    )

    @field_validator("passages")
    @classmethod
    def _passage_texts(cls, passages: list[str] | None) -> list[str] | None:
        if passages is not None and not passages:
            raise ValueError("the list of passages is empty")
        for i, text in enumerate(passages or ()):
            if not text.strip():
                raise ValueError(f"passage {i} is an empty text")
        return passages

    @model_validator(mode="after")
    def _one_form(self) -> QARequest:
        if self.passages is not None:
            if self.inputs is not None:
                raise ValueError("give question + passages, or inputs, not both")
            if self.context is not None:
                raise ValueError("give a context or passages, not both")
            if self.question is None:
                raise ValueError("passages need a question")
            return self
        if self.top_k_passages is not None or self.embedding_model is not None:
            raise ValueError("top_k_passages and embedding_model go with passages")
        single = self.question is not None or self.context is not None
        if single and self.inputs is not None:
            raise ValueError("give either question + context, or inputs, not both")
        if not single and self.inputs is None:
            raise ValueError("give question and context (or inputs: a list of them)")
        if single and (self.question is None or self.context is None):
            raise ValueError("question and context go together: give both")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        if self.inputs is not None:
            return [(i.question, i.context) for i in self.inputs]
        assert self.question is not None and self.context is not None
        return [(self.question, self.context)]


class Answer(TypedDict):
    answer: str
    score: float
    start: Annotated[int, Field(description="Character offset of the answer in the context.")]
    end: Annotated[int, Field(description="context[start:end] == answer.")]
    model: Annotated[str, Field(description="The model that answered (a student, or its teacher).")]


class PassageAnswer(Answer):
    passage: Annotated[
        int,
        Field(description="The passage (its index in `passages`) holding it: passages[passage][start:end]."),
    ]


def no_answer(model: str) -> Answer:
    return Answer(answer="", score=0.0, start=0, end=0, model=model)


def doc_stride(max_length: int, room: int, requested: int | None) -> int:
    """Overlap between windows, in tokens: a third of the window unless asked (384 -> 128, as in SQuAD).

    At most half the room the question leaves for the context, so each window moves on by at least as
    much as it repeats: an overlap of nearly the whole room would split a context into a window per token
    or two (hundreds of engine calls for a few kilobytes of text)."""
    most = room // 2
    if requested is None:
        return min(max_length // 3, most)
    if requested > most:
        raise InvalidInputError(
            f"doc_stride: {requested} tokens of overlap; beside this question the windows hold {room} "
            f"tokens of context, so at most {most} (half of them)"
        )
    return requested


def _context_offsets(window: EncodedText) -> list[tuple[int, int] | None]:
    return [o if s == 1 else None for o, s in zip(window.offsets, window.sequence_ids, strict=True)]


def _stack(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.float64)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


@dataclass(frozen=True)
class SpanRules:
    """What a request asks of its answers."""

    top_k: int = 1
    max_answer_length: int = 30
    handle_impossible_answer: bool = False
    stride: int | None = None  # window overlap in tokens; None: doc_stride's default


async def answer_all(
    model: ServedModel,
    pairs: Sequence[tuple[str, str]],
    rules: SpanRules,
    metrics: Metrics,
    timeout_s: float,
    x: Exchange,
) -> list[list[Answer]]:
    """The answers to each (question, context) pair. Every pair's windows go to the batcher as one
    request's sequences: queued all or none, and leaving together."""
    windows = [_windows(model, question, context, rules, metrics, x) for question, context in pairs]
    outputs = await run_all(model, [w for pair in windows for w in pair], timeout_s, x)
    answers, taken = [], 0
    for (_, context), pair in zip(pairs, windows, strict=True):
        answers.append(_answers(context, pair, outputs[taken : taken + len(pair)], rules, model.name))
        taken += len(pair)
    return answers


def _windows(
    model: ServedModel, question: str, context: str, rules: SpanRules, metrics: Metrics, x: Exchange
) -> list[EncodedText]:
    check_chars([question], x, "question")
    check_chars([context], x, "context")  # no window limit: a long context is split into windows
    with tokenizing(metrics, model, x):
        room = model.encoder.context_room(question)
        window = model.encoder.max_length
        if room < window // 4:  # else a long context splits into a window per few tokens
            raise InvalidInputError(
                f"the question is too long: beside it the model's window of {window} tokens keeps "
                f"{max(room, 0)} for the context, and the context needs at least {window // 4} (a quarter)"
            )
        windows = model.encoder.encode_windows(question, context, doc_stride(window, room, rules.stride))
    if not any(1 in w.sequence_ids for w in windows):  # e.g. only zero-width spaces or control characters
        raise InvalidInputError("the context has no text the model can read (it tokenizes to nothing)")
    return windows


def _answers(
    context: str,
    windows: list[EncodedText],
    outputs: Sequence[dict[str, np.ndarray]],
    rules: SpanRules,
    model: str,
) -> list[Answer]:
    """The best spans over all of a context's windows, best first."""
    width = max(len(w) for w in windows)
    start = _stack([o["start_logits"] for o in outputs], width)
    end = _stack([o["end_logits"] for o in outputs], width)
    offsets = offsets_array([_context_offsets(w) for w in windows], width)
    spans = top_spans(start, end, offsets, top_k=rules.top_k, max_answer_length=rules.max_answer_length)
    probabilities = span_probabilities(start, end, offsets, spans, max_answer_length=rules.max_answer_length)
    answers = [
        Answer(
            answer=context[s.start_char : s.end_char],
            score=p,
            start=s.start_char,
            end=s.end_char,
            model=model,
        )
        for s, p in zip(spans, probabilities, strict=True)
    ]
    if rules.handle_impossible_answer and (not spans or null_score(start, end) > spans[0].score):
        score = 1.0 if not spans else _null_probability(start, end)
        answers.insert(0, Answer(answer="", score=score, start=0, end=0, model=model))
        answers = answers[: rules.top_k]
    return answers


def _null_probability(start: np.ndarray, end: np.ndarray) -> float:
    """P(start = [CLS]) x P(end = [CLS]) in the window where 'no answer' is least likely."""

    def softmax_first(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e[:, 0] / e.sum(axis=1)

    return float((softmax_first(start) * softmax_first(end)).min())


async def cascaded(
    model: ServedModel,
    pairs: Sequence[tuple[str, str]],
    rules: SpanRules,
    threshold: float | None,
    c: Collaborators,
    timeout_s: float,
    x: Exchange,
    budget_ms: float | None = None,
) -> list[list[Answer]]:
    """answer_all by the model, and by its teacher for the pairs it is unsure of (service.cascade)."""

    def answer(
        served: ServedModel, some: Sequence[tuple[str, str]], x: Exchange
    ) -> Awaitable[list[list[Answer]]]:
        return answer_all(served, some, rules, c.metrics, timeout_s, x)

    return await c.pairs.answer(model, pairs, answer, threshold, x, budget_ms)


def best_over_passages(
    read: Sequence[int], results: Sequence[list[Answer]], top_k: int
) -> list[PassageAnswer]:
    """The best answers over the passages read (`read`: their indices), best first. An empty answer
    (handle_impossible_answer) ranks only when it is every passage's best: one passage without the answer
    says nothing of the others."""
    rows = [
        PassageAnswer(
            answer=a["answer"], score=a["score"], start=a["start"], end=a["end"], model=a["model"], passage=i
        )
        for i, answers in zip(read, results, strict=True)
        for a in answers
    ]
    if all(not answers or not answers[0]["answer"] for answers in results):
        rows.sort(key=lambda r: (r["answer"] != "", -r["score"]))  # stable: ties keep the passages' rank
    else:
        rows = sorted((r for r in rows if r["answer"]), key=lambda r: -r["score"])
    return rows[:top_k]


async def retrieve_then_read(
    model: ServedModel, body: QARequest, rules: SpanRules, c: Collaborators, x: Exchange
) -> PassageAnswer | list[PassageAnswer]:
    """Rank the passages by the embedding model, read the nearest with the QA model (and its teacher, for
    those it is unsure of), answer with the best spans and their passages."""
    assert body.question is not None and body.passages is not None  # QARequest._one_form
    question, passages = body.question, body.passages
    if len(passages) > c.settings.max_client_batch:
        raise InvalidInputError(
            f"passages: {len(passages)} texts, at most {c.settings.max_client_batch} per request",
            param="passages",
        )
    check_chars([question], x, "question")
    check_chars(passages, x, "passage")
    embedder = retrieval.embedding_model(body.embedding_model, c)
    k = min(body.top_k_passages or TOP_K_PASSAGES, len(passages))
    read = await retrieval.retrieve(embedder, question, passages, k, c, x)
    x.items = len(read)  # the QA model's inferences: the pairs it reads
    pairs = [(question, passages[i]) for i in read]
    timeout_s, budget_ms = c.settings.request_timeout_s, body.cascade_budget_ms
    results = await cascaded(model, pairs, rules, body.cascade_threshold, c, timeout_s, x, budget_ms)
    ranked = best_over_passages(read, results, rules.top_k) or [
        PassageAnswer(answer="", score=0.0, start=0, end=0, model=model.name, passage=read[0])
    ]
    return ranked[0] if rules.top_k == 1 else ranked


async def handle(
    body: QARequest, x: Exchange, c: Collaborators
) -> Answer | list[Answer] | list[list[Answer]] | PassageAnswer | list[PassageAnswer]:
    model = c.resolve(NAME, body.model, body.version, x)
    rules = SpanRules(body.top_k, body.max_answer_length, body.handle_impossible_answer, body.doc_stride)
    if body.passages is not None:
        return await retrieve_then_read(model, body, rules, c, x)
    pairs = body.pairs()
    c.check_batch(len(pairs), x)
    timeout_s, budget_ms = c.settings.request_timeout_s, body.cascade_budget_ms
    results = await cascaded(model, pairs, rules, body.cascade_threshold, c, timeout_s, x, budget_ms)
    if body.top_k == 1:
        flat = [r[0] if r else no_answer(model.name) for r in results]
        return flat[0] if body.inputs is None else flat
    return results[0] if body.inputs is None else results


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    questions, contexts = job.texts["QUESTION"], job.texts["CONTEXT"]
    pairs = [{"question": q, "context": c} for q, c in zip(questions, contexts, strict=True)]
    names = {"question": "QUESTION", "context": "CONTEXT", "inputs": "QUESTION/CONTEXT"}
    body = validated(QARequest, {"inputs": pairs, **passed(job, TASK.v2.parameters)}, names)
    rules = SpanRules(1, body.max_answer_length, body.handle_impossible_answer, body.doc_stride)
    threshold = body.cascade_threshold
    budget_ms = body.cascade_budget_ms
    results = await cascaded(
        job.model, body.pairs(), rules, threshold, job.c, job.timeout_s, job.x, budget_ms
    )
    best = [r[0] if r else no_answer(job.model.name) for r in results]
    return {
        "ANSWER": strings([a["answer"] for a in best]),
        "SCORE": np.array([a["score"] for a in best], dtype=np.float32),
        "START": np.array([a["start"] for a in best], dtype=np.int64),
        "END": np.array([a["end"] for a in best], dtype=np.int64),
        "MODEL": answered_by(best),
    }


TASK = ServedTask(
    name=NAME,
    endpoints=(
        Endpoint(
            "/v1/qa",
            QARequest,
            Answer | list[Answer] | list[list[Answer]] | PassageAnswer | list[PassageAnswer],
            "Extract answers: one pair -> an answer (a list with top_k > 1); `inputs` -> one per pair; "
            "`passages` -> the best answer of the passages nearest the question, and its passage.",
            handle,
        ),
    ),
    v2=V2Interface(
        inputs=("QUESTION", "CONTEXT"),
        outputs=(
            tensor("ANSWER", "BYTES"),
            tensor("SCORE", "FP32"),
            tensor("START", "INT64"),
            tensor("END", "INT64"),
            ANSWERED_BY,
        ),
        parameters=(
            "max_answer_length",
            "doc_stride",
            "handle_impossible_answer",
            "cascade_threshold",
            "cascade_budget_ms",
        ),
        run=infer,
    ),
)
