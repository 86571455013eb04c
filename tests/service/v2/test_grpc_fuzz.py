"""ModelInfer and ModelStreamInfer over gRPC fed requests hypothesis builds from the protocol's own
messages: any tensor names, datatypes, shapes, typed or raw contents and parameters, for every served model
and one that is not. However wrong, a request is answered with a status that says whose fault it is
(INVALID_ARGUMENT, NOT_FOUND, ...; on a stream, its error message): never INTERNAL or UNKNOWN, every streamed
request ends, and the server keeps answering."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from tests.service.live_server import live_server
from tests.service.v2.helpers import CLS, LM, MLM, QA, grpc_stub

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
MODELS = [CLS, QA, MLM, LM, "not-served"]
TENSOR_NAMES = ["TEXT", "QUESTION", "CONTEXT", "PROMPT", "LABEL", "SCORE", "TOKENS", ""]
DATATYPES = ["BYTES", "INT64", "INT32", "FP32", "FP64", "BOOL", "UINT8", "FP16", "bytes", ""]
CLIENT_FAULTS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,  # the server's own word for "not now": shed, draining
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


@pytest.fixture(scope="module")
def stub(tiny_repository: Path, grpc_port: int) -> Iterator[Any]:
    with live_server(tiny_repository, {"DISTILSERVE_GRPC_PORT": str(grpc_port)}):
        channel, raw = grpc_stub(grpc_port)
        with channel:
            yield raw


def _parameter() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda v: service_pb2.InferParameter(bool_param=v), st.booleans()),
        st.builds(lambda v: service_pb2.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda v: service_pb2.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
        st.builds(lambda v: service_pb2.InferParameter(double_param=v), st.floats(allow_subnormal=False)),
        st.builds(lambda v: service_pb2.InferParameter(string_param=v), st.text(max_size=8)),
    )


PARAMETERS = st.dictionaries(
    st.sampled_from(["max_new_tokens", "temperature", "seed", "top_k", "binary_data_size", "stream", "x"]),
    _parameter(),
    max_size=3,
)
CONTENTS = st.one_of(
    st.builds(
        lambda v: service_pb2.InferTensorContents(bytes_contents=v),
        st.lists(st.binary(max_size=40), max_size=4),
    ),
    st.builds(
        lambda v: service_pb2.InferTensorContents(int64_contents=v),
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    ),
    st.builds(
        lambda v: service_pb2.InferTensorContents(fp32_contents=v),
        st.lists(st.floats(width=32, allow_subnormal=False), max_size=4),
    ),
    st.builds(
        lambda v: service_pb2.InferTensorContents(bool_contents=v), st.lists(st.booleans(), max_size=4)
    ),
    st.just(service_pb2.InferTensorContents()),
)


def _input(name: str, datatype: str, shape: list[int], contents: Any, parameters: dict[str, Any]) -> Any:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=shape, contents=contents
    )
    for key, value in parameters.items():
        tensor.parameters[key].CopyFrom(value)
    return tensor


INPUTS = st.lists(
    st.builds(
        _input,
        st.sampled_from(TENSOR_NAMES),
        st.sampled_from(DATATYPES),
        st.lists(st.one_of(st.integers(-2, 5), st.just(2**62)), max_size=3),
        CONTENTS,
        PARAMETERS,
    ),
    max_size=3,
)


def _request(
    model: str,
    version: str,
    inputs: list[Any],
    outputs: list[str],
    raw: list[bytes],
    parameters: dict[str, Any],
) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, inputs=inputs)
    request.outputs.extend(service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in outputs)
    request.raw_input_contents.extend(raw)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    return request


REQUESTS = st.builds(
    _request,
    st.sampled_from(MODELS),
    st.sampled_from(["", "1", "2", "x"]),
    INPUTS,
    st.lists(st.sampled_from(TENSOR_NAMES), max_size=2),
    st.lists(st.binary(max_size=24), max_size=2),
    PARAMETERS,
)


def test_no_request_gets_an_internal_error(stub: Any) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=REQUESTS)
    def check(request: Any) -> None:
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as e:
            assert e.code() in CLIENT_FAULTS, (e.code(), e.details(), request)
            assert e.details(), "a refusal says why"

    check()
    live = stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)  # and the server is still there
    assert live.live


def test_no_streamed_request_gets_an_internal_error(stub: Any) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests=st.lists(REQUESTS, min_size=1, max_size=3))
    def check(requests: list[Any]) -> None:
        for request in requests:
            request.parameters["triton_enable_empty_final_response"].bool_param = True
        finals = 0
        for response in stub.ModelStreamInfer(iter(requests), timeout=60):
            assert not response.error_message.startswith("internal error"), (response.error_message, requests)
            finals += response.infer_response.parameters["triton_final_response"].bool_param
        assert finals == len(requests)  # every request ended, failed or not

    check()
    live = stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
    assert live.live
