"""ONNX files of any size: weights past protobuf's 2 GB limit on one file go beside the graph as ONNX
external data, in one file named after it (`model.onnx` -> `model.onnx.data`), which ONNX Runtime and
`onnx.load` find by themselves; the repository lists that file with its variant (VariantSpec.data)."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import numpy as np
import onnx
from onnx import helper, numpy_helper

ONE_FILE_BYTES = 2**31 - 2**26  # protobuf's 2 GB limit on one ONNX file, less room for the graph itself
INLINE_BYTES = 1024  # tensors smaller than this stay inside the graph (onnx's own default)
ALIGN = 4096  # each tensor in the weights file starts at a page: ONNX Runtime can map it rather than copy


def weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the graph's initializers, from their shapes (what is inline and what is not alike)."""
    total = 0
    for tensor in model.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        total += count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def data_path(path: Path) -> Path:
    """Where `save` writes the weights of the graph at `path` when they do not fit in it."""
    return path.with_name(path.name + ".data")


def save(model: onnx.ModelProto, path: Path) -> None:
    """`model` to `path`: inline when its weights fit one file, else into `data_path(path)` (small tensors
    stay inline). Writing externally moves the weights out of `model`: read the file again to use them."""
    data = data_path(path)
    data.unlink(missing_ok=True)  # a stale one from an earlier write would be appended to
    if weight_bytes(model) <= ONE_FILE_BYTES:
        onnx.save(model, str(path))
        return
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )


def external_data(path: Path) -> Path | None:
    """The one file beside `path` that its graph reads weights from (None: all inline); an error where the
    graph reads several, or from elsewhere (the repository keeps one file a variant beside the graph)."""
    model = onnx.load(str(path), load_external_data=False)
    locations = {
        entry.value
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    if not locations:
        return None
    if len(locations) > 1 or Path(next(iter(locations))).name != next(iter(locations)):
        raise ValueError(f"{path} reads its weights from {sorted(locations)}: save it again with `save`")
    return path.with_name(next(iter(locations)))


def consolidate(path: Path) -> None:
    """Rewrite the graph at `path` with `save` where it reads its weights from other files than the one
    `save` names (torch.onnx writes a file a tensor for a model past 2 GB)."""
    try:
        if external_data(path) in (None, data_path(path)):
            return
    except ValueError:
        pass  # several files: gathered into one below
    save(onnx.load(str(path)), path)


class WeightsFile:
    """Tensors written to `path` as a graph builder makes them, each returned as a reference to its bytes
    there: a model past 2 GB is never whole in memory as ONNX tensors (a copy of all its weights, and a
    second one to serialise them, beside the PyTorch model). Save the graph beside the file afterwards."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("wb")
        self._offset = 0

    def tensor(self, array: np.ndarray, name: str) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        padding = -self._offset % ALIGN
        self._file.write(b"\0" * padding)
        self._offset += padding
        tensor = onnx.TensorProto(
            name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype)
        )
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", self._offset), ("length", array.nbytes)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self._file.write(array.data)  # C-contiguous: its bytes as they lie, no copy
        self._offset += array.nbytes
        return tensor

    def __enter__(self) -> WeightsFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._file.close()
