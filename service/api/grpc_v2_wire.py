"""The Open Inference Protocol's gRPC messages read into /v2's envelope and written from /v2's outputs, and
/v2's error statuses as gRPC codes (service.api.grpc_v2 serves them).

A ModelInferRequest becomes the `InferenceRequest` and binary tensor data that /v2's HTTP route parses from
its body: `raw_input_contents` (one per input, 4-byte length-prefixed BYTES elements) are binary inputs
sized by `binary_data_size`, typed `contents` are JSON data; /v2 then checks every rule itself. Outputs go
back in `raw_output_contents`, as Triton sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from pydantic import ValidationError
from tritonclient.grpc import service_pb2

from service.api.v2 import v2_status
from service.api.v2_schemas import (
    InferenceRequest,
    OutputChoice,
    TensorError,
    datatype_of,
    describe_validation,
    tensor_bytes,
)
from service.served import ServedModel

Code = grpc.StatusCode
STATUS_CODES: dict[int, Any] = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    404: Code.NOT_FOUND,
    413: Code.RESOURCE_EXHAUSTED,
    429: Code.RESOURCE_EXHAUSTED,
    499: Code.CANCELLED,
    500: Code.INTERNAL,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}
_FORWARDED = ("retry-after", "www-authenticate")  # /v2's headers that mean something to a gRPC client
_HTTP_ONLY = ("binary_data_size", "binary_data")  # tensor parameters of HTTP's binary extension


@dataclass(frozen=True)
class Failure:
    """Why a request failed, as gRPC says it: /v2's status, its code, trailing metadata and message."""

    status: int
    code: Any
    metadata: tuple[tuple[str, str], ...]
    message: str


def grpc_status(exc: Exception) -> tuple[int, Any, tuple[tuple[str, str], ...]] | None:
    """/v2's HTTP status of a failure, its gRPC code and the metadata to send; None for a bug."""
    found = v2_status(exc)
    if found is None:
        return None
    status, headers = found
    metadata = tuple((k.lower(), v) for k, v in headers.items() if k.lower() in _FORWARDED)
    return status, STATUS_CODES.get(status, Code.UNKNOWN), metadata


# -- protobuf <-> /v2's envelope ------------------------------------------------------------------------


def _value(parameter: Any) -> Any:
    """An InferParameter's value (bool, int, str or float), None when unset."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def _parameters(parameters: Any, drop: Sequence[str] = ()) -> dict[str, Any]:
    return {k: _value(v) for k, v in parameters.items() if k not in drop}


def _contents(contents: Any) -> list[Any]:
    """The elements of whichever typed field is filled (a BYTES input in int64_contents is refused later,
    element by element, as /v2 refuses a number among texts)."""
    if contents.bytes_contents:
        return list(contents.bytes_contents)
    filled = contents.ListFields()
    return list(filled[0][1]) if filled else []


def read_request(request: Any) -> tuple[InferenceRequest, bytes]:
    """A ModelInferRequest as /v2's envelope and binary tensor data: raw contents become binary inputs
    (their bytes concatenated in input order, each sized by `binary_data_size`), typed contents JSON data."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise TensorError(
            f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: one per input"
        )
    inputs = []
    for i, tensor in enumerate(request.inputs):
        given = tensor.HasField("contents")
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
            "parameters": _parameters(tensor.parameters, _HTTP_ONLY),
        }
        if raw:
            if given:
                raise TensorError(
                    f"input {tensor.name}: give either contents or raw_input_contents, not both"
                )
            entry["parameters"]["binary_data_size"] = len(raw[i])
        elif given:
            entry["data"] = _contents(tensor.contents)
        elif tensor.datatype == "BYTES":
            raise TensorError(f"input {tensor.name} has neither contents nor raw_input_contents")
        inputs.append(entry)
    outputs = [{"name": o.name, "parameters": _parameters(o.parameters, _HTTP_ONLY)} for o in request.outputs]
    envelope = {
        "id": request.id or None,
        "parameters": _parameters(request.parameters),
        "inputs": inputs,
        "outputs": outputs or None,
    }
    try:
        return InferenceRequest.model_validate(envelope), b"".join(raw)
    except ValidationError as e:  # a negative dimension, no inputs
        raise TensorError(describe_validation(e)) from None


def infer_response(
    request_id: str,
    model: ServedModel,
    tensors: dict[str, Any],
    choices: Sequence[OutputChoice],
    parameters: dict[str, str | int] | None = None,
) -> Any:
    """The outputs asked for, each in raw_output_contents (as Triton answers; HTTP's binary_data is moot),
    and the response's `parameters` (v2.answer_parameters: strings and integers)."""
    response = service_pb2.ModelInferResponse(
        model_name=model.name, model_version=str(model.manifest.version), id=request_id
    )
    for key, value in (parameters or {}).items():
        if isinstance(value, str):
            response.parameters[key].string_param = value
        else:
            response.parameters[key].int64_param = value
    for choice in choices:
        array = tensors[choice.name]
        response.outputs.add(name=choice.name, datatype=datatype_of(array), shape=array.shape)
        response.raw_output_contents.append(tensor_bytes(array))
    return response
