"""Open Inference Protocol v2 wire types: the JSON envelope, and tensors as JSON or as binary data.

The binary tensor data extension, byte for byte as tritonclient speaks it (`tritonclient/http/_utils.py`,
`_infer_input.py`, `_infer_result.py`): the body is a JSON header of `Inference-Header-Content-Length`
bytes, then the raw bytes of every tensor whose `parameters.binary_data_size` says it travels in binary,
in the order the header lists them. Numbers are little-endian and row-major; a BYTES element is a 4-byte
little-endian unsigned length followed by that many bytes. Responses use the same layout.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.errors import PayloadTooLargeError
from service.tasks.contract import TensorError, TensorMetadata

BINARY_HEADER = "Inference-Header-Content-Length"
_LENGTH = struct.Struct("<I")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # deflate: zlib-wrapped, as HTTP means
_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(object): "BYTES"}


# -- metadata ---------------------------------------------------------------------------------------------


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ErrorBody(BaseModel):
    error: str


# -- the request envelope ---------------------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestInput(_Wire):
    name: str
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    data: list[Any] | None = None


class RequestOutput(_Wire):
    name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class InferenceRequest(_Wire):
    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


def describe_validation(error: ValidationError, prefix: str = "") -> str:
    """pydantic's errors as one line: `where: what` per problem."""
    parts = []
    for e in error.errors():
        where = prefix + ".".join(str(x) for x in e["loc"])
        parts.append(f"{where or 'body'}: {str(e['msg']).removeprefix('Value error, ')}")
    return "; ".join(parts)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tensor data after it (none without the header-length header)."""
    if header_length is None:
        return body, b""
    try:
        size = int(header_length)
    except ValueError:
        raise TensorError(f"{BINARY_HEADER} must be an integer, got {header_length!r}") from None
    if not 0 < size <= len(body):
        raise TensorError(f"{BINARY_HEADER} is {size} but the body has {len(body)} bytes")
    return body[:size], body[size:]


def _json(header: bytes) -> Any:
    """The header as JSON; json.loads's other failures (too deep, a number too long) are the client's too."""
    try:
        return json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TensorError(f"malformed JSON in the inference request ({e})") from None
    except RecursionError:
        raise TensorError("the inference request's JSON nests too deeply to parse") from None
    except ValueError as e:
        reason = str(e).partition(";")[0]  # drop Python's advice to the server (sys.set_int_max_str_digits)
        raise TensorError(f"the inference request's JSON cannot be parsed ({reason})") from None


def parse_request(header: bytes) -> InferenceRequest:
    raw = _json(header)
    if not isinstance(raw, dict):
        raise TensorError("the inference request must be a JSON object")
    try:
        return InferenceRequest.model_validate(raw)
    except ValidationError as e:
        raise TensorError(describe_validation(e)) from None


# -- body encoding and request parameters ----------------------------------------------------------------


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body as sent before tritonclient's request_compression_algorithm, at most `max_bytes` of it
    (the body cap would mean nothing if a small gzip could expand without bound)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in _WBITS:
        raise TensorError(f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none")
    inflater = zlib.decompressobj(_WBITS[encoding])
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise TensorError(f"the body is not valid {encoding} data ({e})") from None
    if len(out) > max_bytes:
        raise PayloadTooLargeError(f"the decompressed request body is over the limit of {max_bytes} bytes")
    if not inflater.eof:
        raise TensorError(f"the {encoding} body is truncated")
    return out


def _accepted_encoding(accept: str | None) -> str | None:
    """gzip or deflate when the client accepts it (tritonclient's response_compression_algorithm)."""
    offered = set()
    for part in (accept or "").lower().split(","):
        token, _, quality = part.partition(";")
        if quality.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            offered.add(token.strip())
    return next((e for e in ("gzip", "deflate") if e in offered), None)


def compress(content: bytes, accept_encoding: str | None, min_bytes: int = 1024) -> tuple[bytes, str | None]:
    """The body compressed as the client accepts (small bodies are not worth it), and the encoding used."""
    encoding = _accepted_encoding(accept_encoding) if len(content) >= min_bytes else None
    if encoding == "gzip":
        return gzip.compress(content, compresslevel=6), encoding
    if encoding == "deflate":
        return zlib.compress(content, 6), encoding
    return content, None


def deadline_s(parameters: dict[str, Any], default_s: float) -> float:
    """The request's deadline: the server's, shortened by v2's `timeout` parameter (microseconds).

    Stateful sequences are refused here too: they are the other request-level parameters v2 defines.
    """
    if parameters.get("sequence_id") not in (None, 0, ""):
        raise TensorError("sequence_id: distilserve models are stateless (no sequence extension)")
    timeout = parameters.get("timeout")
    if timeout is None or timeout == 0:
        return default_s
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise TensorError("parameters.timeout must be a non-negative integer (microseconds)")
    return min(default_s, timeout / 1e6)


# -- input tensors ----------------------------------------------------------------------------------------


def _binary_slices(inputs: Sequence[RequestInput], binary: bytes) -> dict[str, bytes]:
    """Each binary input's bytes, cut from the data after the header in the order the header lists them."""
    slices: dict[str, bytes] = {}
    offset = 0
    for tensor in inputs:
        params = tensor.parameters
        if "shared_memory_region" in params:
            raise TensorError(f"input {tensor.name}: shared memory is not supported; send the data")
        size = params.get("binary_data_size")
        if size is None:
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TensorError(f"input {tensor.name}: binary_data_size must be a non-negative integer")
        if tensor.data is not None:
            raise TensorError(f"input {tensor.name}: give either data or binary_data_size, not both")
        if offset + size > len(binary):
            raise TensorError(f"input {tensor.name}: binary_data_size {size} runs past the request body")
        slices[tensor.name] = binary[offset : offset + size]
        offset += size
    if offset != len(binary):
        raise TensorError(f"{len(binary) - offset} bytes of binary data follow the inputs unclaimed")
    return slices


def _split_bytes_elements(raw: bytes, name: str) -> list[bytes]:
    elements = []
    offset = 0
    while offset < len(raw):
        if offset + _LENGTH.size > len(raw):
            raise TensorError(f"input {name}: truncated BYTES element length at byte {offset}")
        (size,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + size > len(raw):
            raise TensorError(f"input {name}: BYTES element of {size} bytes runs past the tensor data")
        elements.append(raw[offset : offset + size])
        offset += size
    return elements


def _flatten(data: list[Any]) -> list[Any]:
    """JSON tensor data may be flat or nested row-major lists; both mean the same elements.

    Without recursion: json.loads may accept nesting deeper than Python's recursion limit (3.13 does).
    """
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _is_unicode(text: str) -> bool:
    """False for a lone surrogate, which JSON can escape ("\\ud800") but no tokenizer can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _texts(tensor: RequestInput, raw: bytes | None) -> list[str]:
    if raw is not None:
        elements: list[Any] = _split_bytes_elements(raw, tensor.name)
    elif tensor.data is not None:
        elements = _flatten(tensor.data)
    else:
        raise TensorError(f"input {tensor.name} has neither data nor binary_data_size")
    texts = []
    for i, element in enumerate(elements):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError:
                raise TensorError(f"input {tensor.name}[{i}] is not valid UTF-8") from None
        if not isinstance(element, str):
            raise TensorError(f"input {tensor.name}[{i}] is {type(element).__name__}, expected a string")
        if not _is_unicode(element):
            raise TensorError(f"input {tensor.name}[{i}] is not valid Unicode (it holds a lone surrogate)")
        texts.append(element)
    return texts


def read_text_inputs(
    request: InferenceRequest, binary: bytes, expected: Sequence[str]
) -> dict[str, list[str]]:
    """The named BYTES [batch] inputs as texts, every rule of the interface checked, or a TensorError."""
    names = [t.name for t in request.inputs]
    if len(set(names)) != len(names):
        raise TensorError(f"inputs name a tensor twice: {names}")
    unknown = [n for n in names if n not in expected]
    missing = [n for n in expected if n not in names]
    if unknown or missing:
        problems = [f"unexpected input {n!r}" for n in unknown] + [f"missing input {n!r}" for n in missing]
        raise TensorError(f"{'; '.join(problems)} (this model takes {', '.join(expected)})")
    raw = _binary_slices(request.inputs, binary)
    texts: dict[str, list[str]] = {}
    for tensor in request.inputs:
        if tensor.datatype != "BYTES":
            raise TensorError(f"input {tensor.name}: datatype {tensor.datatype}, expected BYTES")
        if len(tensor.shape) != 1:
            raise TensorError(f"input {tensor.name}: shape {tensor.shape}, expected [batch]")
        values = _texts(tensor, raw.get(tensor.name))
        if len(values) != tensor.shape[0]:
            raise TensorError(
                f"input {tensor.name}: shape {tensor.shape} holds {tensor.shape[0]} elements, "
                f"the data has {len(values)}"
            )
        texts[tensor.name] = values
    batches = {len(v) for v in texts.values()}
    if len(batches) > 1:
        raise TensorError(f"inputs {', '.join(expected)} must have the same batch size")
    return texts


# -- output tensors ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputChoice:
    """One output to return: in binary or in JSON, optionally as top-n classifications."""

    name: str
    binary: bool
    classification: int = 0


def _as_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TensorError(f"{what} must be true or false")
    return value


def choose_outputs(request: InferenceRequest, available: Sequence[str]) -> list[OutputChoice]:
    """The outputs asked for (all when none are named); `binary_data` overrides `binary_data_output`."""
    default = _as_bool(request.parameters.get("binary_data_output", False), "binary_data_output")
    if request.outputs is None:
        return [OutputChoice(name, default) for name in available]
    choices = []
    for out in request.outputs:
        if out.name not in available:
            raise TensorError(f"unknown output {out.name!r} (this model has {', '.join(available)})")
        if "shared_memory_region" in out.parameters:
            raise TensorError(f"output {out.name}: shared memory is not supported")
        binary = _as_bool(out.parameters.get("binary_data", default), f"output {out.name}: binary_data")
        count = out.parameters.get("classification", 0)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise TensorError(f"output {out.name}: classification must be a non-negative integer")
        choices.append(OutputChoice(out.name, binary, count))
    return choices


def classifications(values: np.ndarray, count: int, labels: Sequence[str] | None) -> np.ndarray:
    """Triton's classification extension: the top `count` of each row as "value:index[:label]" (BYTES)."""
    if values.ndim != 2:
        raise TensorError("classification needs an output with a class axis ([batch, classes])")
    rows = []
    for row in values:
        best = np.argsort(-row, kind="stable")[: min(count, row.shape[0])]
        rows.append([f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "") for i in best])
    return np.array(rows, dtype=object).reshape(values.shape[0], -1)


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype of an output tensor (FP32, INT64 or BYTES)."""
    return _DATATYPES[array.dtype]


def tensor_bytes(array: np.ndarray) -> bytes:
    """A tensor's raw bytes as v2 lays them out, the same in HTTP's binary data and gRPC's raw contents."""
    if array.dtype == object:
        encoded = [str(v).encode("utf-8") for v in array.ravel()]
        return b"".join(_LENGTH.pack(len(b)) + b for b in encoded)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def encode_response(
    head: dict[str, Any], tensors: dict[str, np.ndarray], choices: Sequence[OutputChoice]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for choice in choices:
        array = tensors[choice.name]
        entry: dict[str, Any] = {"name": choice.name, "datatype": datatype_of(array)}
        entry["shape"] = list(array.shape)
        if choice.binary:
            blob = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = (
                [str(v) for v in array.ravel()] if array.dtype == object else array.ravel().tolist()
            )
        outputs.append(entry)
    header = json.dumps({**head, "outputs": outputs}, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)
