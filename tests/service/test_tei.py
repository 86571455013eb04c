"""TEI's /tokenize and /info over the tiny repository: each token's id is the model's own, its text the piece
of the input it came from, special tokens marked and placed nowhere; /info a classifier's labels and the
server's limits; which model, when several are served, is named, and a mistake is a clear 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES

CLS, LM = TASK_MODEL_NAMES["text-classification"], TASK_MODEL_NAMES["text-generation"]
QA = TASK_MODEL_NAMES["question-answering"]
TEXT = "Acme was founded by John Smith in 1950."


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as c:
        yield c


def tokenize(client: TestClient, status: int = 200, **body: Any) -> Any:
    r = client.post("/tokenize", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_tokens_are_the_models_own_ids_and_pieces_of_the_text(client: TestClient) -> None:
    from tokenizers import Tokenizer

    for model in (CLS, LM):
        (tokens,) = tokenize(client, inputs=TEXT, model=model)
        served = client.app.state.registry.get(model)  # type: ignore[attr-defined]
        reference = Tokenizer.from_file(str(served.version.directory / "tokenizer.json"))
        reference.no_truncation()
        expected = reference.encode(TEXT)
        assert [t["id"] for t in tokens] == expected.ids
        for token, special in zip(tokens, expected.special_tokens_mask, strict=True):
            assert token["special"] == bool(special)
            if special:
                assert token["start"] is None and token["stop"] is None and token["text"]
            else:
                assert token["text"] == TEXT[token["start"] : token["stop"]]


def test_special_tokens_can_be_left_out_and_a_list_gets_a_list_each(client: TestClient) -> None:
    bare = tokenize(client, inputs=[TEXT, "film"], model=CLS, add_special_tokens=False)
    assert len(bare) == 2 and not any(t["special"] for text in bare for t in text)
    (full,) = tokenize(client, inputs=TEXT, model=CLS)
    assert [t for t in full if not t["special"]] == bare[0]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"inputs": TEXT}, 422, "models with different tokenizers are served"),
        ({"inputs": TEXT, "model": "nope"}, 404, "'nope' is not served"),
        ({"inputs": "", "model": CLS}, 422, "empty"),
        ({"inputs": TEXT, "model": CLS, "prompt_name": "query"}, 413, "prompt_name is not supported"),
    ],
)
def test_mistakes_are_clear_4xx(client: TestClient, body: dict[str, Any], status: int, message: str) -> None:
    assert message in tokenize(client, status, **body)["error"]


def test_info_gives_a_classifiers_labels_and_the_servers_limits(
    client: TestClient, tiny_repository: Path
) -> None:
    r = client.get("/info", params={"model": CLS})
    assert r.status_code == 200, r.text
    info = r.json()
    card = next(m for m in client.get("/v1/models").json()["models"] if m["name"] == CLS)
    assert info["model_id"] == CLS and info["max_input_length"] == card["max_sequence_length"]
    labels = {str(i): label for i, label in enumerate(card["labels"])}
    assert info["model_type"] == {"classifier": {"id2label": labels}}
    settings = Settings(model_repository=tiny_repository)
    assert (info["max_client_batch_size"], info["max_batch_tokens"]) == (
        settings.max_client_batch,
        settings.max_batch_tokens,
    )
    assert info["model_dtype"] == "float32" and info["auto_truncate"] is (settings.truncation == "truncate")


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({}, 422, "models are served"),
        ({"model": QA}, 422, "serves question-answering"),
        ({"model": "nope"}, 404, "'nope' is not served"),
    ],
)
def test_info_mistakes_are_clear_4xx(
    client: TestClient, params: dict[str, str], status: int, message: str
) -> None:
    r = client.get("/info", params=params)
    assert r.status_code == status and message in r.json()["error"], r.text
