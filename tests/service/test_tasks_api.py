"""QA, fill-mask and generation over HTTP, each checked against the PyTorch model it was exported from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from common.spans import best_span, offsets_array
from service.app import create_app
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES

CONTEXT = (
    "Acme was founded by John Smith in 1950 in the city of Springfield. "
    "Who founded Acme? When was it founded? Where is Springfield? "
) * 3


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as c:
        yield c


def torch_qa_span(
    model_dir: Path, question: str, context: str, max_length: int, stride: int
) -> tuple[int, int]:
    """The reference: HF tokenizer windows, the PyTorch model's logits, the same span rule."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    enc = tokenizer(
        question,
        context,
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        out = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            token_type_ids=enc["token_type_ids"],
        )
    windows = [
        [o if s == 1 else None for o, s in zip(offsets.tolist(), enc.sequence_ids(w), strict=True)]
        for w, offsets in enumerate(enc["offset_mapping"])
    ]
    span = best_span(out.start_logits.numpy(), out.end_logits.numpy(), offsets_array(windows))
    assert span is not None
    return span.start_char, span.end_char


def test_qa_span_matches_pytorch_across_windows(client: TestClient, tiny_models: dict[str, Path]) -> None:
    question = "Who founded Acme?"
    r = client.post("/v1/qa", json={"question": question, "context": CONTEXT, "doc_stride": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert CONTEXT[body["start"] : body["end"]] == body["answer"] and 0 < body["score"] <= 1
    max_length = 64  # the tiny model's window: the context needs several windows
    expected = torch_qa_span(tiny_models["question-answering"], question, CONTEXT, max_length, 8)
    assert (body["start"], body["end"]) == expected


def test_qa_windows_step_on_by_at_least_half_their_room(client: TestClient, tiny_repository: Path) -> None:
    """The default overlap shrinks beside a long question; a long context still needs few windows."""
    from tokenizers import Tokenizer

    question = "who " * 40  # 40 tokens + 3 special of the tiny model's 64 leave 21 for the context
    context = "Acme was founded in 1950 by John Smith. " * 30
    model = TASK_MODEL_NAMES["question-answering"]
    tokenizer = Tokenizer.from_file(str(next((tiny_repository / model).glob("*/tokenizer.json"))))
    context_tokens = len(tokenizer.encode(context, add_special_tokens=False).ids)
    before = client.get("/metrics").text
    r = client.post("/v1/qa", json={"question": question, "context": context})
    assert r.status_code == 200, r.text
    assert context[r.json()["start"] : r.json()["end"]] == r.json()["answer"]
    windows = sequences_run(client.get("/metrics").text) - sequences_run(before)
    assert 1 < windows <= -(-(context_tokens - 21) // (21 - 21 // 2)) + 1  # steps of at least 11 tokens


def test_qa_pairs_are_queued_as_one_request(tiny_repository: Path) -> None:
    """Each pair fits the queue; together they never can: a 422 saying so, not a 429 forever."""
    context = "Acme was founded in 1950 by John Smith. " * 12  # a few windows of the tiny model each
    pairs = [{"question": "Who founded Acme?", "context": context}] * 4
    settings = Settings(model_repository=tiny_repository, warmup=False, max_queue=8)
    with TestClient(create_app(settings)) as small_queue:
        assert small_queue.post("/v1/qa", json=pairs[0]).status_code == 200
        r = small_queue.post("/v1/qa", json={"inputs": pairs})
    assert r.status_code == 422, r.text
    assert "sequences at once; the queue holds at most 8" in r.json()["error"]


def sequences_run(metrics: str) -> float:
    """Sequences the QA model has computed (its batch sizes' sum)."""
    model = TASK_MODEL_NAMES["question-answering"]
    line = next(
        x for x in metrics.splitlines() if x.startswith(f'distilserve_batch_size_sum{{model="{model}"')
    )
    return float(line.split()[-1])


def test_qa_top_k_and_batches(client: TestClient) -> None:
    pairs = [
        {"question": "Where is Springfield?", "context": CONTEXT},
        {"question": "When?", "context": "In 1950."},
    ]
    r = client.post("/v1/qa", json={"inputs": pairs, "top_k": 3})
    assert r.status_code == 200, r.text
    first, second = r.json()
    assert len(first) == 3 and [a["score"] for a in first] == sorted(
        (a["score"] for a in first), reverse=True
    )
    assert all(
        pair["context"][a["start"] : a["end"]] == a["answer"]
        for pair, row in zip(pairs, r.json(), strict=True)
        for a in row
    )
    assert second and second[0]["answer"] in "In 1950."


def torch_fill_mask(model_dir: Path, text: str, k: int) -> tuple[list[int], list[float]]:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    enc = tokenizer(text, return_tensors="pt")
    position = int((enc["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0])
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[0, position], -1)
    top = torch.topk(probs, k)
    return top.indices.tolist(), top.values.tolist()


def test_fill_mask_top5_matches_pytorch(client: TestClient, tiny_models: dict[str, Path]) -> None:
    text = "I loved this [MASK], it was wonderful."
    r = client.post("/v1/fill-mask", json={"inputs": text})
    assert r.status_code == 200, r.text
    candidates = r.json()
    ids, probs = torch_fill_mask(tiny_models["fill-mask"], text, 5)
    assert [c["token"] for c in candidates] == ids
    assert [c["score"] for c in candidates] == pytest.approx(probs, abs=1e-5)
    assert all("[MASK]" not in c["sequence"] and c["sequence"].startswith("i loved this") for c in candidates)
    many = client.post("/v1/fill-mask", json={"inputs": [text, "A dull [MASK]."], "top_k": 2}).json()
    assert [len(row) for row in many] == [2, 2] and many[0][0]["token"] == ids[0]


def torch_greedy(model_dir: Path, prompt: str, n: int) -> tuple[list[int], Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export.greedy import greedy_torch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return greedy_torch(model, tokenizer(prompt)["input_ids"], n, tokenizer.eos_token_id), tokenizer


def test_generate_is_greedy_pytorch(client: TestClient, tiny_models: dict[str, Path]) -> None:
    r = client.post("/v1/generate", json={"prompt": "Acme was founded by", "max_new_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    expected, tokenizer = torch_greedy(tiny_models["text-generation"], "Acme was founded by", 12)
    assert body["tokens"] == len(expected)
    assert body["generated_text"] == tokenizer.decode([t for t in expected if t != tokenizer.eos_token_id])
    assert body["finish_reason"] == ("eos" if expected[-1] == tokenizer.eos_token_id else "length")


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/fill-mask", {"inputs": "no mask here"}, 422, "0 [MASK] tokens"),
        ("/v1/fill-mask", {"inputs": "[MASK] and [MASK]"}, 422, "2 [MASK] tokens"),
        ("/v1/fill-mask", {"inputs": ["ok [MASK]", "none"]}, 422, "input 1 has 0"),
        ("/v1/fill-mask", {"inputs": "[MASK] " + "word " * 200 + "[MASK]"}, 422, "2 [MASK] tokens"),
        (
            "/v1/fill-mask",
            {"inputs": "word " * 200 + "[MASK]"},
            422,
            "[MASK] lies past the model's 64 tokens",
        ),
        ("/v1/qa", {"question": "Who?"}, 422, "question and context go together"),
        ("/v1/qa", {"context": "text"}, 422, "question and context go together"),
        ("/v1/qa", {}, 422, "give question and context"),
        ("/v1/qa", {"question": "", "context": "x"}, 422, "question"),
        ("/v1/qa", {"question": "Who?", "context": "x", "top_k": 0}, 422, "top_k"),
        ("/v1/qa", {"question": "Who? " * 200, "context": "x"}, 422, "the question is too long"),
        ("/v1/qa", {"question": "who " * 50, "context": "x"}, 422, "keeps 11 for the context"),
        ("/v1/qa", {"question": "Who?", "context": "x", "doc_stride": 40}, 422, "doc_stride: 40 tokens"),
        ("/v1/qa", {"question": "Who?", "context": "\u200b\u200b"}, 422, "the context has no text the model"),
        ("/v1/generate", {"prompt": ""}, 422, "prompt"),
        ("/v1/generate", {"prompt": "word " * 300}, 422, "window is 64 tokens"),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 0}, 422, "max_new_tokens"),
        ("/v1/generate", {"prompt": "hi", "model": TASK_MODEL_NAMES["fill-mask"]}, 422, "serves fill-mask"),
    ],
)
def test_task_endpoints_reject_bad_input(
    client: TestClient, path: str, body: dict, status: int, message: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_models_lists_every_task(client: TestClient) -> None:
    cards = {c["task"]: c for c in client.get("/v1/models").json()["models"]}
    assert set(cards) == {"text-classification", "question-answering", "fill-mask", "text-generation"}
    assert cards["fill-mask"]["mask_token"] == "[MASK]"
    assert cards["text-generation"]["instances"] == 1  # a decode loop is one engine call at a time
    assert all(np.isfinite(c["max_sequence_length"]) for c in cards.values())
