"""TaskRoute: the task endpoints skip FastAPI's per-request work and keep its contract (schema, errors)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=tiny_repository, warmup=False))) as c:
        yield c


def test_the_schema_still_documents_the_body_and_the_answer(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/classify"]["post"]
    body = operation["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ClassifyRequest"}
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert "LabelScore" in str(answer)


def test_the_schema_documents_each_routes_error_shape_without_warnings(client: TestClient) -> None:
    app = client.app
    app.openapi_schema = None  # type: ignore[attr-defined]  # built anew, not the cached one
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. FastAPI's duplicate operation ids
        paths = app.openapi()["paths"]  # type: ignore[attr-defined]

    def error_schema(path: str, method: str, status: str) -> str:
        return str(paths[path][method]["responses"][status]["content"]["application/json"]["schema"])

    assert "ErrorBody" in error_schema("/v1/classify", "post", "422")
    for path in ("/v1/completions", "/v1/chat/completions"):  # OpenAI's 400, never a 422
        assert "OpenAIErrorBody" in error_schema(path, "post", "400")
        assert "422" not in paths[path]["post"]["responses"]
    assert set(paths["/health"]) == {"get"}  # HEAD is served, not documented twice


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "the request body is empty"),
        (b"[1, 2]", "body: Input should be an object"),
        (b'{"inputs": "a", "top_k": 0}', "top_k: Input should be greater than or equal to 1"),
        (b'{"inputs": "a", "colour": "red"}', "colour: Extra inputs are not permitted"),
        (b'{"inputs": "a"', "malformed JSON body"),
    ],
)
def test_bad_bodies_are_422_with_the_field_named(client: TestClient, content: bytes, expected: str) -> None:
    r = client.post("/v1/classify", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "validation"
    assert expected in r.json()["error"], r.json()


def test_the_answer_is_the_response_models_json(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"inputs": ["a wonderful film", "a dull film"], "top_k": 2})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    rows = r.json()
    assert [[set(item) for item in row] for row in rows] == [[{"label", "score", "model"}] * 2] * 2
    for row in rows:
        assert row[0]["score"] >= row[1]["score"]
        assert sum(item["score"] for item in row) == pytest.approx(1.0)


def test_a_form_is_415_before_its_body_is_read(client: TestClient) -> None:
    r = client.post("/v1/classify", data={"inputs": "a"})
    assert r.status_code == 415
    assert "application/json" in r.json()["error"]
