"""The HTTP service end to end, in-process: answers match PyTorch, batching coalesces, bad input is a 4xx."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager

from export.variants import DEFAULT_VARIANTS, DRAFT_VARIANTS
from service.app import create_app
from service.engine import Engine, EngineError
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings

SENTENCES = ["I loved this film, it was wonderful", "A dull, terrible film. I hated every minute of it."]


async def serve(settings: Settings, engine_factory=ort_engine_factory) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    app = create_app(settings, engine_factory)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def run_with_client(settings: Settings, body, engine_factory=ort_engine_factory):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async for client in serve(settings, engine_factory):
            return await body(client)

    return asyncio.run(main())


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(rf"^{re.escape(name)}(\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


@pytest.fixture
def settings(classification_repository: Path) -> Settings:
    return Settings(model_repository=classification_repository, variant="fp32", max_batch_size=16)


def torch_probabilities(student_dir: Path, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(student_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
    return torch.softmax(logits, -1).numpy()


def test_classify_matches_the_pytorch_student(settings: Settings, demo_pair: tuple[Path, Path]) -> None:
    async def body(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        one = await client.post("/v1/classify", json={"inputs": SENTENCES[0]})
        many = await client.post("/v1/classify", json={"inputs": SENTENCES, "top_k": 2})
        return one, many

    one, many = run_with_client(settings, body)
    assert one.status_code == 200 and many.status_code == 200
    single = one.json()
    assert isinstance(single, list) and set(single[0]) == {"label", "score", "model"} and len(single) == 1
    expected = torch_probabilities(demo_pair[1], SENTENCES)
    labels = {0: "negative", 1: "positive"}
    for row, probs in zip(many.json(), expected, strict=True):
        assert [r["label"] for r in row] == [labels[int(i)] for i in np.argsort(-probs)]
        for r in row:
            assert r["score"] == pytest.approx(
                float(probs[{v: k for k, v in labels.items()}[r["label"]]]), abs=1e-4
            )
    assert single[0]["label"] == many.json()[0][0]["label"]
    assert single[0]["score"] == pytest.approx(many.json()[0][0]["score"], abs=1e-5)


def test_64_concurrent_requests_take_fewer_engine_calls(settings: Settings) -> None:
    texts = [
        f"the film was {'wonderful' if i % 2 else 'terrible'} " + "and long " * (i % 7) for i in range(64)
    ]

    async def body(client: httpx.AsyncClient) -> tuple[list[httpx.Response], str]:
        responses = await asyncio.gather(*(client.post("/v1/classify", json={"inputs": t}) for t in texts))
        return list(responses), (await client.get("/metrics")).text

    responses, metrics = run_with_client(settings, body)
    assert all(r.status_code == 200 for r in responses)
    calls = metric_value(metrics, "distilserve_batch_size_count", model="sentiment")
    sequences = metric_value(metrics, "distilserve_batch_size_sum", model="sentiment")
    assert sequences == 64
    assert 1 <= calls < 64
    assert metric_value(metrics, "distilserve_requests_total", model="sentiment", status="200") == 64


def test_metrics_move_with_each_request(settings: Settings) -> None:
    async def body(client: httpx.AsyncClient) -> tuple[str, str]:
        before = (await client.get("/metrics")).text
        await client.post("/v1/classify", json={"inputs": "a fine film"})
        await client.post("/v1/classify", json={"inputs": ""})
        for read in ("/v1/models", "/v2/models/sentiment", "/v2/models/sentiment/ready", "/ready"):
            assert (await client.get(read)).status_code == 200  # reads: not requests for work
        return before, (await client.get("/metrics")).text

    before, after = run_with_client(settings, body)
    assert metric_value(after, "distilserve_requests_total", status="200") == 1
    assert metric_value(after, "distilserve_requests_total", status="422") == 1
    for name in (
        "distilserve_request_duration_seconds_count",
        "distilserve_queue_duration_seconds_count",
        "distilserve_inference_duration_seconds_count",
        "distilserve_tokenize_duration_seconds_count",
        "distilserve_batch_size_count",
    ):
        assert metric_value(after, name) > metric_value(before, name), name
    assert metric_value(after, "distilserve_model_info", model="sentiment", variant="fp32") == 1


def test_health_ready_and_models(settings: Settings) -> None:
    async def body(client: httpx.AsyncClient) -> list[httpx.Response]:
        probes = [await client.head(p) for p in ("/health", "/ready", "/v2/health/live", "/v2/health/ready")]
        return [*probes, *[await client.get(p) for p in ("/health", "/ready", "/v1/models")]]

    *heads, health, ready, models = run_with_client(settings, body)
    assert [h.status_code for h in heads] == [200] * 4 and all(h.content == b"" for h in heads)
    assert health.json() == {"status": "ok"} and ready.status_code == 200
    [card] = models.json()["models"]
    assert card["name"] == "sentiment" and card["version"] == 1 and card["task"] == "text-classification"
    assert card["provider"] == "CPUExecutionProvider" and card["variant"] == "fp32"
    assert card["frontends"] == 1 and card["instances"] >= 1 and card["threads_per_instance"] >= 1
    assert card["labels"] == ["negative", "positive"] and card["chat"] is None  # not a generation model
    assert card["distillation"]["metric"] == "accuracy"
    # every variant the export was asked for is either in the version or has its reason for being left out
    # (a draft is asked of a generation student only)
    assert set(card["variants"]) | set(card["rejected_variants"]) == set(DEFAULT_VARIANTS) - DRAFT_VARIANTS
    assert not set(card["variants"]) & set(card["rejected_variants"])
    assert all(card["rejected_variants"].values())


BAD_REQUESTS = [
    (dict(content=b""), 422, "body is empty"),
    (dict(content=b"{not json"), 422, "malformed JSON"),
    (dict(json={"inputs": 42}), 422, "expected a string or a list of strings"),
    (dict(json={"inputs": ""}), 422, "empty"),
    (dict(json={"inputs": "   "}), 422, "empty"),
    (dict(json={"inputs": []}), 422, "empty"),
    (dict(json={"inputs": ["ok", None]}), 422, "item 1"),
    (dict(json={"inputs": "ok", "top_k": 0}), 422, "top_k"),
    (dict(json={"inputs": "ok", "top_k": "two"}), 422, "top_k"),
    (dict(json={"inputs": "ok", "model": "nope"}), 404, "not served"),
    (dict(json={"inputs": "ok", "model": "sentiment", "version": 9}), 404, "no version 9"),
    (dict(json={"inputs": ["ok"] * 65}), 422, "at most 64"),
    (dict(json={"text": "ok"}), 422, "inputs"),
    (dict(content=b'{"inputs": "ok"}', headers={"content-type": "text/plain"}), 415, "application/json"),
]


@pytest.mark.parametrize(("kwargs", "status", "message"), BAD_REQUESTS)
def test_bad_input_gets_a_clear_4xx(settings: Settings, kwargs: dict, status: int, message: str) -> None:
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}

    async def body(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/classify", headers=headers, **kwargs)

    response = run_with_client(settings, body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


class FlakyEngine:
    """The real engine, except that batches with long rows fail (to prove failures stay in their batch)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.input_names = inner.input_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if feeds["input_ids"].shape[1] > 30:
            raise EngineError("simulated device fault")
        return self.inner.run(feeds)


def test_a_failing_engine_call_fails_only_its_batch(settings: Settings) -> None:
    def factory(version: ModelVersion, variant: str, s: Settings) -> Engine:
        return FlakyEngine(ort_engine_factory(version, variant, s))

    async def body(client: httpx.AsyncClient) -> list[httpx.Response]:
        long = await client.post("/v1/classify", json={"inputs": "long " * 40})
        short = await client.post("/v1/classify", json={"inputs": "short and sweet"})
        return [long, short]

    long, short = run_with_client(settings.model_copy(update={"warmup": False}), body, factory)
    assert long.status_code == 500 and "simulated device fault" in long.json()["error"]
    assert short.status_code == 200


def test_a_start_up_that_fails_after_the_engine_opened_closes_it(settings: Settings) -> None:
    """Left running, its batcher threads would hold the process at exit instead of letting it be restarted."""
    import threading
    import time

    from fastapi.testclient import TestClient

    async def siblings_never_came_up() -> None:
        raise RuntimeError("the other frontends did not start")

    before = set(threading.enumerate())
    with (
        pytest.raises(RuntimeError, match="did not start"),
        TestClient(create_app(settings, loaded=siblings_never_came_up)),
    ):
        pass
    deadline = time.monotonic() + 10
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith("engine-")]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [t for t in left if t.is_alive()]
    assert not left, [t.name for t in left]
