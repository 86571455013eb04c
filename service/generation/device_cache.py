"""The running sequences' KV cache kept on the engine's device between decode steps (IO binding).

With optimum's graph (`present_positions="all"`) a step's `present` is its past with the new position
appended as the last column, for every row. Rows are right-aligned here: row r's positions are the last
`lengths[r]` columns, the columns to their left are padding that the attention mask hides, and each row
keeps its own position ids (so, as in the host cache, it computes the same logits alone or in company).
Every row's new position then lands in the same column, the last, so a step's presents ARE the next step's
past: bound as the next call's inputs, the cache never leaves the device. A decode step copies only the
input ids, attention mask and position ids to the device and the logits back.

A join or a leave changes the rows. The cache is then re-formed on the device by a four-op graph of its own
(row_graph.py: the rows that stay gathered and re-aligned to the new longest, the joining rows stacked
after them), one call for all layers at the step after the change; only the joining rows' caches, which
their prefill left on the host, are uploaded. `RowGather` counts those rebuilds and bytes
(benchmarks/io_binding_bench.py reports both).

distilserve's appending graph (`present_positions="new"`) returns only the new position. Writing it into a
device cache needs what ONNX Runtime's Python API does not offer: an OrtValue cannot be written into on the
device, and an output cannot be bound to one column of the cache (in [batch, heads, positions, head_dim] a
column is not contiguous). That graph keeps the host `SlotCache` (runner.py), with its inputs and outputs
bound, until its export also returns past + new.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.engine import DeviceEngine, Feed
from service.generation.row_graph import row_graph

HostLayer = tuple[np.ndarray, np.ndarray]  # keys, values of one sequence: [heads, positions, head_dim]
DeviceLayer = tuple[ort.OrtValue, ort.OrtValue]  # keys, values of the batch: [rows, heads, columns, head_dim]


class RowGather:
    """Re-forms a device cache's rows on the device (row_graph.py), every tensor in one call: one helper
    session per dtype and tensor count, made at first use and shared by the runner's successive caches.
    Counts rebuilds and the bytes uploaded."""

    def __init__(self, engine: DeviceEngine) -> None:
        self._engine = engine
        self._sessions: dict[tuple[np.dtype, int], DeviceEngine] = {}
        self.rebuilds = 0  # steps whose rows changed
        self.uploaded_bytes = 0  # joining rows' caches, host to device

    def __call__(
        self, caches: list[ort.OrtValue], keep: np.ndarray, crop: int, pad: int, new: list[np.ndarray]
    ) -> list[ort.OrtValue]:
        """Each of `caches`' rows `keep`, less `crop` columns and with `pad` zero columns on the left, then
        the rows of its `new` array; the `new` arrays alone (uploaded) when no row stays."""
        self.rebuilds += 1
        self.uploaded_bytes += sum(array.nbytes for array in new)
        if not caches or not len(keep):
            return [self._engine.to_device(array) for array in new]
        key = (new[0].dtype, len(new))
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = self._engine.companion(row_graph(*key))
        feeds: dict[str, Feed] = {
            "keep": keep,
            "start": np.array([crop], dtype=np.int64),
            "end": np.array([caches[0].shape()[2]], dtype=np.int64),
            "axes": np.array([2], dtype=np.int64),
            "pads": np.array([0, 0, pad, 0, 0, 0, 0, 0], dtype=np.int64),
        }
        for i, (cache, array) in enumerate(zip(caches, new, strict=True)):
            feeds[f"cache.{i}"], feeds[f"new.{i}"] = cache, array
        names = [f"out.{i}" for i in range(len(new))]
        outputs = session.run_bound(feeds, keep=set(names))
        return [outputs[name] for name in names]


class DeviceCache:
    """Row r is sequence `ids[r]`, its positions in the last `lengths[r]` of the cache's columns; the
    interface is the host `SlotCache`'s: `feeds`, `join`, `leave`, `append`. Rows that stay keep their
    order and joining rows come after them, so `ids` is final as soon as a step's joins and leaves are in."""

    def __init__(self, heads: int, head_dim: int, gather: RowGather) -> None:
        self.ids: list[int] = []
        self._shape = (heads, head_dim)
        self._gather = gather
        self._past: list[DeviceLayer] = []
        self._lengths = np.zeros(0, dtype=np.int64)
        self._width = 0  # the past's columns
        self._laid_out: list[int] = []  # the sequences of the device tensors' rows, in order
        self._joining: dict[int, list[HostLayer]] = {}  # prefilled caches to add at the next step
        self._dtype = np.dtype(np.float32)  # the cache's, as the prefill gave it

    @property
    def device_name(self) -> str:
        """Where the past lives, as ONNX Runtime names it ("cuda", "cpu"); empty before the first step."""
        return str(self._past[0][0].device_name()) if self._past else ""

    def feeds(self) -> tuple[list[DeviceLayer], np.ndarray, np.ndarray]:
        """The past (on the device), the attention mask (past + the new position) and new position ids."""
        if self.ids != self._laid_out:
            self._rebuild()
        mask = np.arange(self._width + 1) >= self._width - self._lengths[:, None]
        return self._past, mask.astype(np.int64), self._lengths[:, None].copy()

    def join(self, seq_id: int, cache: list[HostLayer]) -> None:
        """A prefilled sequence joins: its cache [heads, length, head_dim] per tensor, on the host."""
        self._joining[seq_id] = cache
        self._dtype = cache[0][0].dtype
        self.ids.append(seq_id)

    def leave(self, seq_id: int) -> None:
        self.ids.remove(seq_id)
        self._joining.pop(seq_id, None)

    def append(self, presents: list[DeviceLayer]) -> None:
        """The step's presents (past + each row's new position, on the device) are the next past."""
        self._past = presents
        self._width += 1
        self._lengths += 1

    def _rebuild(self) -> None:
        """The rows as `ids` lists them: those that stay, then the joining ones, right-aligned to the
        longest (zero columns on the left: masked, but finite); on the device, in one call."""
        row_of = {seq_id: row for row, seq_id in enumerate(self._laid_out)}
        staying = [seq_id for seq_id in self.ids if seq_id in row_of]
        joining = [self._joining[seq_id] for seq_id in self.ids if seq_id not in row_of]
        assert self.ids == staying + [i for i in self.ids if i not in row_of], "joining rows come last"
        keep = np.array([row_of[seq_id] for seq_id in staying], dtype=np.int64)
        new_lengths = [row[0][0].shape[1] for row in joining]
        lengths = np.concatenate([self._lengths[keep], np.array(new_lengths, dtype=np.int64)])
        width = int(lengths.max())
        crop, pad = max(0, self._width - width), max(0, width - self._width)
        layers = len(self._past) or len(joining[0])
        new: list[np.ndarray] = []
        for layer in range(layers):
            for tensor in (0, 1):
                array = np.zeros((len(joining), self._shape[0], width, self._shape[1]), dtype=self._dtype)
                for r, row in enumerate(joining):
                    array[r, :, width - new_lengths[r] :] = row[layer][tensor]
                new.append(array)
        old = [value for pair in self._past for value in pair]
        flat = self._gather(old, keep, crop, pad, new)
        past = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        self._past, self._lengths, self._width = past, lengths, width
        self._laid_out, self._joining = list(self.ids), {}
