"""What the v2 protocol tests share: the served models' names and small helpers to build inputs and read
outputs (the server and tritonclient are conftest.py's fixtures, one server per test module)."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import numpy as np
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import TASK_MODEL_NAMES

CLS = TASK_MODEL_NAMES["text-classification"]
QA = TASK_MODEL_NAMES["question-answering"]
MLM = TASK_MODEL_NAMES["fill-mask"]
LM = TASK_MODEL_NAMES["text-generation"]
MAX_CLIENT_BATCH = 4
CONTEXT = "Acme was founded by John Smith in 1950 in the city of Springfield."


def texts_input(name: str, texts: list[str], binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(texts)], "BYTES")
    return tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)


def outputs(names: list[str], binary: bool) -> list[triton.InferRequestedOutput] | None:
    """None (tritonclient then asks for every output in binary) or every output named, in JSON."""
    return None if binary else [triton.InferRequestedOutput(n, binary_data=False) for n in names]


def strings(array: np.ndarray) -> list[Any]:
    """BYTES outputs come back as bytes when binary, as str when JSON; compare them as str."""
    return [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]


def v1(base_url: str, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{base_url}{path}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def grpc_stub(grpc_port: int) -> tuple[grpc.Channel, Any]:
    """A raw stub, for what tritonclient cannot send (typed contents, metadata, malformed requests)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def text_tensor(name: str, texts: list[str]) -> Any:
    """A BYTES input in `contents.bytes_contents` (KServe's typed encoding, not raw_input_contents)."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return tensor
