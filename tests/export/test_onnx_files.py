"""ONNX files of any size: weights past one file's limit go into one file beside the graph, which ONNX
Runtime and onnx.load read as if they were inside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export import onnx_files
from export.onnx_files import consolidate, data_path, external_data, save, weight_bytes


def two_layer_graph() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(8, 64)).astype(np.float32), rng.normal(size=(64, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.ones((2, 8), dtype=np.float32)})[0]


def test_weights_that_fit_stay_inside_the_graph(tmp_path: Path) -> None:
    model = two_layer_graph()
    assert weight_bytes(model) == (8 * 64 + 64 * 8) * 4
    save(model, tmp_path / "model.onnx")
    assert external_data(tmp_path / "model.onnx") is None and not data_path(tmp_path / "model.onnx").exists()


def test_weights_past_the_limit_go_beside_the_graph_and_compute_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(two_layer_graph(), tmp_path / "inline.onnx")
    monkeypatch.setattr(onnx_files, "ONE_FILE_BYTES", 1000)  # the 2 GB limit, lowered to this graph's size
    path = tmp_path / "model.onnx"
    save(two_layer_graph(), path)
    assert external_data(path) == tmp_path / "model.onnx.data"
    assert path.stat().st_size < 1000 and (tmp_path / "model.onnx.data").stat().st_size == weight_bytes(
        two_layer_graph()
    )
    np.testing.assert_array_equal(run(path), run(tmp_path / "inline.onnx"))
    save(two_layer_graph(), path)  # written again: the old weights file is replaced, not appended to
    assert (tmp_path / "model.onnx.data").stat().st_size == weight_bytes(two_layer_graph())


def test_weights_in_a_file_a_tensor_are_gathered_into_one(tmp_path: Path) -> None:
    """What torch.onnx writes for a model past 2 GB: the repository keeps one weights file a variant."""
    path = tmp_path / "model.onnx"
    onnx.save_model(two_layer_graph(), str(path), save_as_external_data=True, all_tensors_to_one_file=False)
    with pytest.raises(ValueError, match="save it again"):
        external_data(path)
    expected = run(path)
    consolidate(path)
    assert external_data(path) is None  # small enough for one file again
    np.testing.assert_array_equal(run(path), expected)


def test_weights_written_as_they_are_made_compute_as_if_inside_the_graph(tmp_path: Path) -> None:
    """A builder's WeightsFile: each large tensor's bytes go to the file at a page boundary as it is made,
    small ones stay inline, and the graph saved beside the file computes as the all-inline one."""
    model = two_layer_graph()
    save(model, tmp_path / "inline.onnx")
    path = tmp_path / "model.onnx"
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bias = np.zeros(8, dtype=np.float32)  # 32 bytes: inline
    with onnx_files.WeightsFile(data_path(path)) as sink:
        tensors = [sink.tensor(array, name) for name, array in arrays.items()] + [sink.tensor(bias, "b")]
    assert [t.data_location for t in tensors] == [TensorProto.EXTERNAL] * 2 + [TensorProto.DEFAULT]
    offsets = [int(e.value) for t in tensors[:2] for e in t.external_data if e.key == "offset"]
    assert offsets == [0, 4096]  # the second starts at the next page
    del model.graph.initializer[:]
    model.graph.initializer.extend(tensors[:2])
    onnx.save(model, str(path))
    assert external_data(path) == data_path(path)
    np.testing.assert_array_equal(run(path), run(tmp_path / "inline.onnx"))
