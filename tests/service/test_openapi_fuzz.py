"""Every HTTP endpoint fed what hypothesis makes of its own OpenAPI schema (schemathesis): whatever a client
sends, the answer is never a 5xx, and every answer is what the schema documents.

The schema is served by a real `python -m service` over one model per task, the encoder pairs (their cascade
and shadow paths), a sentence encoder and a Llama with a chat template, with each `model` field and `{name}`
path parameter narrowed to the served names (and one that is not served), so the generated requests reach
the tasks' own checks instead of stopping at "not served". Loading and unloading models is left out: it
would change what the rest of the run finds served.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import PAIR_NAMES, TASK_MODEL_NAMES
from tests.service.live_server import LiveServer, live_server

EMBEDDER = "embed"
CHAT = "chat"  # a Llama with a chat template: /v1/chat/completions renders the messages with it
PAIRS = [name for student in PAIR_NAMES.values() for name in (student, f"{student}-teacher")]
# every served name, and one that is not: requests name them, answers say which of them answered
NAMES = [*TASK_MODEL_NAMES.values(), *PAIRS, EMBEDDER, CHAT, "not-served"]
LEFT_OUT = ("/load", "/unload")
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))  # per operation; a longer hunt: FUZZ_EXAMPLES=1000
# what every answer must be; not "schema-valid data is accepted": a task checks more than a schema can say
# (an empty text, a window too long in tokens, a model serving another task) and says so with a 4xx
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def served(
    tiny_repository: Path,
    pair_repository: Path,
    tiny_llama_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    import shutil

    from export.pipeline import export_model
    from tests.export.test_embeddings_export import build_sentence_model, write_sentences

    root = tmp_path_factory.mktemp("fuzzed")
    repository = root / "models"
    for source in (tiny_repository, pair_repository):
        shutil.copytree(source, repository, dirs_exist_ok=True)
    sentences = write_sentences(root / "sentences.txt")
    encoder = build_sentence_model(root / EMBEDDER)
    exported = export_model(
        encoder, "sentence-embeddings", EMBEDDER, repository, ("fp32",), eval_data=sentences
    )
    assert exported.version_dir is not None
    with live_server(repository, env={"DISTILSERVE_SHADOW_RATE": "0.5"}) as server:
        yield server


def aimed_at_served_models(raw: dict[str, Any]) -> dict[str, Any]:
    """The schema with every `model` property (requests' and answers'), `model` query parameter and `name`
    path parameter drawn from NAMES."""

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict) and "model" in properties:
                properties["model"] = {"enum": NAMES}
            if (node.get("in"), node.get("name")) in (("path", "name"), ("query", "model")):
                node["schema"] = {"enum": NAMES}
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    raw["paths"] = {p: ops for p, ops in raw["paths"].items() if not p.endswith(LEFT_OUT)}
    visit(raw)
    return raw


def operations() -> list[tuple[str, str]]:
    """(method, path) of every documented operation; the schema is the app's own, read without serving."""
    from service.app import create_app
    from service.settings import Settings

    raw = aimed_at_served_models(create_app(Settings()).openapi())
    return [(method.upper(), path) for path, ops in raw["paths"].items() for method in ops]


@pytest.fixture(scope="module")
def api_schema(served: LiveServer) -> Any:
    raw = httpx.get(f"{served.base_url}/openapi.json", timeout=10).json()
    return schemathesis.openapi.from_dict(aimed_at_served_models(raw))


@pytest.mark.parametrize(("method", "path"), operations())
def test_no_request_gets_a_server_error_or_an_undocumented_answer(
    method: str, path: str, api_schema: Any, served: LiveServer
) -> None:
    operation = api_schema[path][method]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        case.call_and_validate(base_url=served.base_url, timeout=30, checks=CHECKS)

    check()
