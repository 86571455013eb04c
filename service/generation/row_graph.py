"""An ONNX graph that re-forms a device KV cache's rows on the device: when sequences join or leave the
running batch, the rows that stay are gathered, re-aligned to the new longest row and stacked with the
joining rows, without the cache leaving the device. For each of the cache's tensors i (every layer's keys
and values, in one call):

    out.i = Concat(Pad(Slice(Gather(cache.i, keep, axis=0), start, end, axes), pads), new.i, axis=0)

cache.i [rows, heads, columns, head_dim]: the old cache; keep [k]: the old rows that stay, in their new
order; start/end/axes [1]: the columns kept (axis 2: cropped on the left when the longest row left); pads
[8]: zero columns added on the left (when a joining row is longer); new.i [m, heads, columns', head_dim]:
the joining rows, right-aligned on the host (their prefill is there).

The service does not depend on `onnx` (ONNX Runtime reads model bytes), so the model is written here
with the dozen protobuf fields it needs (onnx.proto's field numbers; tests check it with onnx.checker).
"""

from __future__ import annotations

import numpy as np

FLOAT, INT64, FLOAT16 = 1, 7, 10  # onnx.TensorProto element types
ELEMENT_TYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.float16): FLOAT16}


def row_graph(dtype: np.dtype, tensors: int) -> bytes:
    """The serialized ModelProto (IR 7, opset 13) for `tensors` cache tensors of `dtype`."""
    kind = ELEMENT_TYPES[np.dtype(dtype)]
    shared = [
        _value("keep", INT64, ("kept",)),
        *(_value(name, INT64, (1,)) for name in ("start", "end", "axes")),
        _value("pads", INT64, (8,)),
    ]
    inputs, outputs, nodes = [], [], []
    for i in range(tensors):
        inputs.append(_value(f"cache.{i}", kind, ("rows", "heads", "columns", "head_dim")))
        inputs.append(_value(f"new.{i}", kind, ("joining", "heads", "new_columns", "head_dim")))
        outputs.append(_value(f"out.{i}", kind, ("out_rows", "heads", "new_columns", "head_dim")))
        nodes += [
            _node(f"gather.{i}", "Gather", [f"cache.{i}", "keep"], [f"kept.{i}"], axis=0),
            _node(f"slice.{i}", "Slice", [f"kept.{i}", "start", "end", "axes"], [f"cropped.{i}"]),
            _node(f"pad.{i}", "Pad", [f"cropped.{i}", "pads"], [f"aligned.{i}"]),
            _node(f"concat.{i}", "Concat", [f"aligned.{i}", f"new.{i}"], [f"out.{i}"], axis=0),
        ]
    graph = b"".join(
        [*(_message(1, n) for n in nodes), _string(2, "kv_rows")]
        + [_message(11, i) for i in [*shared, *inputs]]
        + [_message(12, o) for o in outputs]
    )
    opset = _string(1, "") + _int(2, 13)
    return _int(1, 7) + _string(2, "distilserve") + _message(7, graph) + _message(8, opset)


def _node(name: str, op_type: str, inputs: list[str], outputs: list[str], **ints: int) -> bytes:
    """NodeProto: input 1, output 2, name 3, op_type 4, attribute 5 (name 1, i 3, type 20 = INT)."""
    attributes = [_message(5, _string(1, key) + _int(3, value) + _int(20, 2)) for key, value in ints.items()]
    fields = [*(_string(1, i) for i in inputs), *(_string(2, o) for o in outputs)]
    return b"".join([*fields, _string(3, name), _string(4, op_type), *attributes])


def _value(name: str, element_type: int, shape: tuple[int | str, ...]) -> bytes:
    """ValueInfoProto: name 1, type 2 -> TypeProto.tensor_type 1 -> elem_type 1, shape 2 -> dim 1 ->
    dim_value 1 | dim_param 2."""
    dims = b"".join(_message(1, _int(1, d) if isinstance(d, int) else _string(2, d)) for d in shape)
    tensor = _int(1, element_type) + _message(2, dims)
    return _string(1, name) + _message(2, _message(1, tensor))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _message(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode())
