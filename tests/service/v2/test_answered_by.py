"""Who answered, over /v2 HTTP and gRPC: a cascade's MODEL output names the model of each input, and the
response's parameters say what X-Distilserve-Answered-By and X-Distilserve-Teacher-Busy say over HTTP
(gRPC clients see no headers).

The pairs are conftest's untrained tiny students and teachers of two seeds (`pair_repository`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from tests.service.live_server import live_server
from tests.service.v2.helpers import CONTEXT, strings, v1

TEXTS = ["I loved this film.", "A dull, terrible film.", "Who founded Acme?", "I hated every minute."]
PROTOCOLS = ("http", "grpc")


@pytest.fixture(scope="module")
def base_url(pair_repository: Path, grpc_port: int) -> Iterator[str]:
    env = {"DISTILSERVE_GRPC_PORT": str(grpc_port), "DISTILSERVE_MAX_WAIT_MS": "0"}
    with live_server(pair_repository, env) as server:
        yield server.base_url


def infer(
    protocol: str,
    clients: dict[str, Any],
    model: str,
    tensors: dict[str, list[str]],
    parameters: dict[str, Any],
) -> tuple[list[str], dict[str, Any]]:
    """The MODEL output of an infer over `protocol`, and the response's parameters as plain values."""
    m: ModuleType = triton if protocol == "http" else triton_grpc
    inputs = [
        m.InferInput(name, [len(texts)], "BYTES").set_data_from_numpy(np.array(texts, dtype=object))
        for name, texts in tensors.items()
    ]
    result = clients[protocol].infer(model, inputs, parameters=parameters)
    if protocol == "http":
        said = result.get_response().get("parameters", {})
    else:
        parameters_back = result.get_response().parameters
        said = {k: getattr(p, p.WhichOneof("parameter_choice")) for k, p in parameters_back.items()}
    return strings(result.as_numpy("MODEL")), said


@pytest.fixture(scope="module")
def clients(base_url: str, grpc_client: triton_grpc.InferenceServerClient) -> Iterator[dict[str, Any]]:
    http = triton.InferenceServerClient(base_url.removeprefix("http://"))
    yield {"http": http, "grpc": grpc_client}
    http.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_input_names_the_model_that_answered_it(
    protocol: str, base_url: str, clients: dict[str, Any]
) -> None:
    alone = v1(base_url, "/v1/classify", {"model": "cls", "inputs": TEXTS, "cascade_threshold": 0.0})
    scores = sorted(row[0]["score"] for row in alone)
    threshold = (scores[1] + scores[2]) / 2  # two inputs below it, two above
    cascaded = v1(base_url, "/v1/classify", {"model": "cls", "inputs": TEXTS, "cascade_threshold": threshold})
    expected = [row[0]["model"] for row in cascaded]
    assert sorted(expected) == ["cls", "cls", "cls-teacher", "cls-teacher"]

    models, said = infer(protocol, clients, "cls", {"TEXT": TEXTS}, {"cascade_threshold": threshold})
    assert models == expected
    assert said == {"answered_by": "cls, cls-teacher"}
    models, said = infer(protocol, clients, "cls", {"TEXT": TEXTS}, {"cascade_threshold": 0.0})
    assert models == ["cls"] * len(TEXTS) and said == {"answered_by": "cls"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_qa_and_fill_mask_name_the_model_of_each_input(protocol: str, clients: dict[str, Any]) -> None:
    pairs = {"QUESTION": ["Who founded Acme?", "Where is Acme?"], "CONTEXT": [CONTEXT, CONTEXT]}
    models, said = infer(protocol, clients, "qa", pairs, {"cascade_threshold": 1.0})
    assert models == ["qa-teacher"] * 2 and said == {"answered_by": "qa-teacher"}
    masked = {"TEXT": ["Acme was [MASK] by John Smith.", "The film was [MASK]."]}
    models, said = infer(protocol, clients, "mlm", masked, {"cascade_threshold": 0.0})
    assert models == ["mlm"] * 2 and said == {"answered_by": "mlm"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_spent_budget_says_how_many_student_answers_stood(protocol: str, clients: dict[str, Any]) -> None:
    """Every input unsure, and a budget already spent when the student is done: the student's answers stand,
    and the response counts them as the teacher-busy header would."""
    parameters = {"cascade_threshold": 1.0, "cascade_budget_ms": 0.001}
    models, said = infer(protocol, clients, "cls", {"TEXT": TEXTS}, parameters)
    assert models == ["cls"] * len(TEXTS)
    assert said == {"answered_by": "cls", "teacher_busy": len(TEXTS)}
