"""The running sequences' KV cache kept on the engine's device between decode steps (IO binding).

With optimum's graph (`present_positions="all"`) a step's `present` is its past with the new position
appended as the last column, for every row. Rows are right-aligned here: row r's positions are the last
`lengths[r]` columns, the columns to their left are padding that the attention mask hides, and each row
keeps its own position ids (so, as in the host cache, it computes the same logits alone or in company).
Every row's new position then lands in the same column, the last, so a step's presents ARE the next step's
past: bound as the next call's inputs, the cache never leaves the device. A decode step copies only the
input ids, attention mask and position ids to the device and the logits back.

A join or a leave changes the rows: the cache goes once through the host (downloaded at the first change
of a step, rows re-aligned to the new longest, uploaded at the next step). Joins and leaves are rare next to
steps; `HostTrips` counts them and their bytes (benchmarks/io_binding_bench.py reports both). Doing them
on the device would need a gather graph of its own.

distilserve's appending graph (`present_positions="new"`) returns only the new position. Writing it into a
device cache needs what ONNX Runtime's Python API does not offer: an OrtValue cannot be written into on the
device, and an output cannot be bound to one column of the cache (in [batch, heads, positions, head_dim] a
column is not contiguous). That graph keeps the host `SlotCache` (runner.py), with its inputs and outputs
bound, until its export also returns past + new.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.engine import DeviceEngine

HostLayer = tuple[np.ndarray, np.ndarray]  # keys, values of one sequence: [heads, positions, head_dim]
DeviceLayer = tuple[ort.OrtValue, ort.OrtValue]  # keys, values of the batch: [rows, heads, columns, head_dim]


@dataclass
class HostTrips:
    """The device cache's trips through the host: one per step in which sequences joined or left."""

    rebuilds: int = 0
    bytes: int = 0  # downloaded and uploaded


class DeviceCache:
    """Row r is sequence `ids[r]`, its positions in the last `lengths[r]` of the cache's columns; the
    interface is the host `SlotCache`'s: `feeds`, `join`, `leave`, `append`."""

    def __init__(self, engine: DeviceEngine, heads: int, head_dim: int, trips: HostTrips) -> None:
        self.ids: list[int] = []
        self._engine = engine
        self._shape = (heads, head_dim)
        self._trips = trips
        self._past: list[DeviceLayer] = []
        self._lengths = np.zeros(0, dtype=np.int64)
        self._width = 0  # the past's columns
        self._host: dict[int, list[HostLayer]] | None = None  # each row's cache while the rows change

    def feeds(self) -> tuple[list[DeviceLayer], np.ndarray, np.ndarray]:
        """The past (on the device), the attention mask (past + the new position) and new position ids."""
        if self._host is not None:
            self._upload()
        mask = np.arange(self._width + 1) >= self._width - self._lengths[:, None]
        return self._past, mask.astype(np.int64), self._lengths[:, None].copy()

    @property
    def device_name(self) -> str:
        """Where the past lives, as ONNX Runtime names it ("cuda", "cpu"); empty before the first step."""
        return str(self._past[0][0].device_name()) if self._past else ""

    def join(self, seq_id: int, cache: list[HostLayer]) -> None:
        """A prefilled sequence joins: its cache [heads, length, head_dim] per tensor, on the host."""
        self._rows()[seq_id] = cache
        self.ids.append(seq_id)

    def leave(self, seq_id: int) -> None:
        del self._rows()[seq_id]
        self.ids.remove(seq_id)

    def append(self, presents: list[DeviceLayer]) -> None:
        """The step's presents (past + each row's new position, on the device) are the next past."""
        self._past = presents
        self._width += 1
        self._lengths += 1

    def _rows(self) -> dict[int, list[HostLayer]]:
        """Each live row's positions on the host: the device cache is downloaded once per change."""
        if self._host is None:
            host = [(keys.numpy(), values.numpy()) for keys, values in self._past]
            self._trips.bytes += sum(k.nbytes + v.nbytes for k, v in host)
            width = self._width
            self._host = {
                seq_id: [(k[row, :, width - n :], v[row, :, width - n :]) for k, v in host]
                for row, (seq_id, n) in enumerate(zip(self.ids, self._lengths.tolist(), strict=True))
            }
        return self._host

    def _upload(self) -> None:
        """The rows right-aligned to the longest, zero-padded on the left (masked, but finite), uploaded."""
        rows = [self._host[seq_id] for seq_id in self.ids] if self._host else []
        lengths = np.array([row[0][0].shape[1] for row in rows], dtype=np.int64)
        width = int(lengths.max(initial=0))
        past: list[DeviceLayer] = []
        for layer in range(len(rows[0]) if rows else 0):
            pair = []
            for tensor in (0, 1):
                shape, dtype = (
                    (len(rows), self._shape[0], width, self._shape[1]),
                    rows[0][layer][tensor].dtype,
                )
                array = np.zeros(shape, dtype=dtype)
                for r, row in enumerate(rows):
                    array[r, :, width - lengths[r] :] = row[layer][tensor]
                self._trips.bytes += array.nbytes
                pair.append(self._engine.to_device(array))
            past.append((pair[0], pair[1]))
        self._past, self._lengths, self._width, self._host = past, lengths, width, None
        self._trips.rebuilds += 1
