"""ModelStreamInfer (Triton's decoupled streaming) as tritonclient.grpc's `start_stream` and
`async_stream_infer` use it, against `python -m service` on the tiny repository: a prompt answered in the
pieces its tokens come in, adding up to /v1/generate's text; other models answered whole, as ModelInfer;
a failed request reported on the stream without ending it; a closed stream cancels its generation."""

from __future__ import annotations

import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.service.live_server import live_server
from tests.service.test_app import metric_value
from tests.service.v2.helpers import CLS, LM

PROMPT = "The film was"


LONG = "long-lm"  # a 1024-token window: a generation long enough to close the stream in the middle of


@pytest.fixture(scope="module")
def base_url(
    tiny_repository: Path, grpc_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    from export.pipeline import export_model
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("grpc-stream")
    repository = root / "models"
    shutil.copytree(tiny_repository, repository)
    long_lm = build_tiny("text-generation", root / LONG, positions=1024)
    assert export_model(long_lm, "text-generation", LONG, repository, ("fp32",)).version_dir is not None
    with live_server(repository, {"DISTILSERVE_GRPC_PORT": str(grpc_port)}) as server:
        yield server.base_url


class Stream:
    """A tritonclient stream and the responses its callback received, in order."""

    def __init__(self, grpc_port: int) -> None:
        self.client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        self.received: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.received.put((result, error)))

    def send(self, model: str, name: str, text: str, request_id: str, **parameters: Any) -> None:
        tensor = triton_grpc.InferInput(name, [1], "BYTES").set_data_from_numpy(
            np.array([text], dtype=object)
        )
        self.client.async_stream_infer(
            model,
            [tensor],
            request_id=request_id,
            parameters=parameters or None,
            enable_empty_final_response=True,
        )

    def until_final(self, requests: int) -> tuple[dict[str, list[Any]], list[str]]:
        """Each request's responses (its final, empty one left out) and the errors, once all ended."""
        answers: dict[str, list[Any]] = {}
        errors: list[str] = []
        ended = 0
        while ended < requests:
            result, error = self.received.get(timeout=60)
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                ended += 1
                assert not response.outputs
                continue
            answers.setdefault(response.id, []).append(result)
        return answers, errors

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(base_url: str, grpc_port: int) -> Iterator[Stream]:
    s = Stream(grpc_port)
    yield s
    s.close()


def v1_text(base_url: str, **fields: Any) -> str:
    body = {"model": LM, "prompt": PROMPT, **fields}
    r = httpx.post(f"{base_url}/v1/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["generated_text"])


def test_a_prompt_streams_in_pieces_that_add_up_to_the_v1_text(base_url: str, stream: Stream) -> None:
    stream.send(LM, "PROMPT", PROMPT, "p", max_new_tokens=12, ignore_eos=True)
    answers, errors = stream.until_final(1)
    assert errors == []
    pieces = answers["p"]
    text = b"".join(r.as_numpy("TEXT")[0] for r in pieces).decode()
    assert text == v1_text(base_url, max_new_tokens=12, ignore_eos=True)
    tokens = [int(r.as_numpy("TOKENS")[0]) for r in pieces]
    assert tokens == sorted(tokens) and tokens[-1] == 12
    reasons = [r.as_numpy("FINISH_REASON")[0] for r in pieces]
    assert reasons == [b""] * (len(pieces) - 1) + [b"length"]
    assert all(not r.get_response().parameters["triton_final_response"].bool_param for r in pieces)


def test_requests_share_a_stream_and_other_models_answer_whole(
    base_url: str, grpc_port: int, stream: Stream
) -> None:
    for i in range(3):
        stream.send(LM, "PROMPT", PROMPT, f"p{i}", max_new_tokens=6 + i)
    stream.send(CLS, "TEXT", "I loved this film", "c")
    answers, errors = stream.until_final(4)
    assert errors == []
    for i in range(3):
        text = b"".join(r.as_numpy("TEXT")[0] for r in answers[f"p{i}"]).decode()
        assert text == v1_text(base_url, max_new_tokens=6 + i)
    (whole,) = answers["c"]
    unary = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    tensor = triton_grpc.InferInput("TEXT", [1], "BYTES")
    tensor.set_data_from_numpy(np.array(["I loved this film"], dtype=object))
    expected = unary.infer(CLS, [tensor])
    for output in expected.get_response().outputs:
        np.testing.assert_array_equal(whole.as_numpy(output.name), expected.as_numpy(output.name))


def test_a_failed_request_is_reported_and_the_stream_goes_on(base_url: str, stream: Stream) -> None:
    stream.send(LM, "PROMPT", PROMPT, "bad", temperature=-1)
    stream.send("nope", "PROMPT", PROMPT, "unknown")
    stream.send(LM, "PROMPT", PROMPT, "good", max_new_tokens=4)
    answers, errors = stream.until_final(3)
    assert len(errors) == 2, errors
    assert any(
        e.startswith("parameters.temperature: Input should be greater than or equal to 0") for e in errors
    )
    assert any(e.startswith("model 'nope' is not served") for e in errors)
    text = b"".join(r.as_numpy("TEXT")[0] for r in answers["good"]).decode()
    assert text == v1_text(base_url, max_new_tokens=4)


def test_closing_the_stream_cancels_its_generation(base_url: str, grpc_port: int) -> None:
    def running_and_generated() -> tuple[float, float]:
        text = httpx.get(f"{base_url}/metrics").text
        running = metric_value(text, "distilserve_running_sequences", model=LONG)
        return running, metric_value(text, "distilserve_generated_tokens_total", model=LONG)

    _, before = running_and_generated()
    s = Stream(grpc_port)
    s.send(LONG, "PROMPT", "a", "long", max_new_tokens=1000, ignore_eos=True)
    s.received.get(timeout=30)  # its first piece: it is generating
    s.close(cancel=True)
    deadline = time.monotonic() + 10
    while running_and_generated()[0] > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    running, after = running_and_generated()
    assert running == 0 and after - before < 1000  # it left the batch before its 1,000 tokens
