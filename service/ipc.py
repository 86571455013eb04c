"""The messages between frontends and the engine core: plain data, token ids and outputs as raw buffers.

A message is a list of frames: one msgpack header (a tagged `msgspec.Struct`), then the arrays it names,
each as raw bytes. Nothing is pickled; a header costs a few microseconds to encode or decode, and an array
is one `tobytes` on the way out and one `np.frombuffer` view on the way in.

They travel over a Unix-domain stream socket driven by each side's own event loop (`Channel`: a length
prefix, the frame lengths, the frames). Measured on 2 cores, a message round trip at 32 in flight cost the
receiving side 13 us of CPU this way, against 59 us with pyzmq's sockets driven the same way and 114 us
through zmq.asyncio: ZMQ hands every message through its own I/O thread (two thread wake-ups a message),
which a box whose cores run the engine cannot spare, and its routing and reconnection add nothing on one
host, where the kernel already says at once when the other side's process is gone.

Frontend -> core: `Hello` (which models, where), `Encode` (a request's sequences), `Generate`, `Abort`,
`StatsQuery`, `ModelsApplied` (a new model set is in use), `Control` (load or unload a model). Core ->
frontend: `Models` (at hello, and at each change of what is served), `Encoded` (one result per sequence),
`Tokens` (one step's tokens of this frontend's streams), `Failed` (a request's error, by kind),
`EngineStats`, `Controlled`.
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Callable, Sequence
from typing import cast

import msgspec
import numpy as np

from service.generation.sampling import Logprob, SamplingParams
from service.tokenization import EncodedText
from service.turn_writes import TurnWriteTransport

Frames = list[bytes]


class EngineUnavailableError(Exception):
    """The engine core is not reachable (it died and is being restarted): HTTP 503 with Retry-After."""

    retry_after_s = 2.0


class Hello(msgspec.Struct, tag=True, array_like=True):
    """A frontend asks what is served (also its way of saying it is there)."""


class Placement(msgspec.Struct, array_like=True):
    """Where and how the core runs one model version (what the frontends report in /v1/models)."""

    name: str
    version: int
    variant: str
    provider: str
    instances: int
    threads: int
    max_queue: int


class IndexRow(msgspec.Struct, array_like=True):
    """One version in the model repository: READY, LOADING, UNLOADING or UNAVAILABLE (with the reason)."""

    name: str
    version: int
    state: str
    reason: str = ""


class Models(msgspec.Struct, tag=True, array_like=True):
    """What the core serves now. Each change is sent to every frontend with the next `generation`; one that
    changes what is served waits for each frontend's `ModelsApplied` before a version it drops stops taking
    work (service.model_control)."""

    models: list[Placement]
    pid: int  # the core's process: a frontend that sees it change knows the core was restarted
    generation: int = 0
    index: list[IndexRow] = []


class ModelsApplied(msgspec.Struct, tag=True, array_like=True):
    """A frontend routes by `Models` of this generation now."""

    generation: int


class Control(msgspec.Struct, tag=True, array_like=True):
    """Explicit model control: `load` or `unload` a model by name (answered `Controlled` or `Failed`)."""

    id: int
    action: str
    model: str


class Controlled(msgspec.Struct, tag=True, array_like=True):
    """The control request is done, and every frontend applied what it changed."""

    id: int


class Encode(msgspec.Struct, tag=True, array_like=True):
    """A request's sequences for one encoder model; frames: input ids, then type ids (int64, back to back)."""

    id: int
    model: str
    version: int
    timeout_s: float
    lengths: list[int]
    shadow: bool = False  # lowest priority: a teacher checking its student (service.batching)
    traced: bool = False  # a sampled request's: its engine calls get spans (service.tracing)
    priority: int = 0  # the client's: lower first among client rows (service.batching)


class Generate(msgspec.Struct, tag=True, array_like=True):
    id: int
    model: str
    version: int
    prompt: list[int]
    params: SamplingParams


class Abort(msgspec.Struct, tag=True, array_like=True):
    """The request's client went away (or a stop string ended it): drop its queued or running work."""

    id: int


class StatsQuery(msgspec.Struct, tag=True, array_like=True):
    """What the engine ran, for Triton's statistics extension."""

    id: int


class Executions(msgspec.Struct, array_like=True):
    """One model version's engine calls: how many, the last one's wall-clock time, and per batch size
    (size, calls, nanoseconds)."""

    name: str
    version: int
    count: int
    last_ms: int
    batches: list[tuple[int, int, int]]


class EngineStats(msgspec.Struct, tag=True, array_like=True):
    id: int
    models: list[Executions]


class OutputSpec(msgspec.Struct, array_like=True):
    """One named output: its dtype and each sequence's shape; its frame holds the rows back to back."""

    name: str
    dtype: str
    shapes: list[tuple[int, ...]]


class Encoded(msgspec.Struct, tag=True, array_like=True):
    id: int
    outputs: list[OutputSpec]
    queue_s: list[float]  # per sequence
    run_s: list[float]  # per sequence: its engine call's time
    batches: list[int]  # per sequence: which engine call (a request's sequences may share one)
    core_s: float  # from the request's arrival in the core to this answer: the rest of a round trip is IPC
    spans: list[str] = []  # per sequence, a traced `Encode`'s only: its engine call's span (service.tracing)


# request id, token, its index, finish reason or "", its log-probabilities and (its first token only) the
# prompt's, where the request asked, and (its first token only, else 0) its prompt tokens the prefix cache had
TokenItem = tuple[int, int, int, str, Logprob | None, list[Logprob] | None, int]


class Tokens(msgspec.Struct, tag=True, array_like=True):
    """One step's new tokens of a frontend's streams."""

    items: list[TokenItem]


class Failed(msgspec.Struct, tag=True, array_like=True):
    """`kind`: queue_full (429, with retry_after_s), deadline (504), closed (503), invalid (422),
    not_found (404), retired (503: the version was unloaded after the request chose it), engine (500)."""

    id: int
    kind: str
    message: str
    retry_after_s: float = 0.0


ToCore = Hello | Encode | Generate | Abort | StatsQuery | ModelsApplied | Control
ToFrontend = Models | Encoded | Tokens | Failed | EngineStats | Controlled

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_to_frontend = msgspec.msgpack.Decoder(ToFrontend)


_PREFIX = struct.Struct("<IB")  # the bytes after the prefix, and the frame count
MAX_MESSAGE = 1 << 31  # a message over 2 GiB is a bug or an attack: the connection is dropped


class Channel(asyncio.Protocol):
    """One end of a frontend <-> core connection: whole messages in, whole messages out.

    `on_message(channel, frames)` gets each message as it completes (the frames are bytes the caller may
    keep); `on_lost(channel)` runs once when the connection ends, however it ends.

    Messages sent during one turn of the event loop leave together in one write, at the end of the turn
    (service.turn_writes): under load a frontend sends several requests per turn and the core answers a
    whole batch at once. Sends happen on the loop's thread only (transports are not thread-safe)."""

    def __init__(
        self,
        on_message: Callable[[Channel, list[bytes]], None],
        on_lost: Callable[[Channel], None] | None = None,
    ) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: TurnWriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transport is not a registered subclass, but is one
        self.transport = TurnWriteTransport(cast(asyncio.Transport, transport), asyncio.get_running_loop())

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        while len(buffer) - at >= _PREFIX.size:
            size, count = _PREFIX.unpack_from(buffer, at)
            if size > MAX_MESSAGE:
                assert self.transport is not None
                self.transport.abort()
                return
            end = at + _PREFIX.size + size
            if len(buffer) < end:
                break
            lengths = struct.unpack_from(f"<{count}I", buffer, at + _PREFIX.size)
            start = at + _PREFIX.size + 4 * count
            frames = []
            for length in lengths:
                frames.append(bytes(buffer[start : start + length]))
                start += length
            at = end
            self._on_message(self, frames)
        if at:
            del buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._on_lost is not None:
            self._on_lost(self)

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, frames: Frames) -> bool:
        """Queue a message for sending; False when the connection is gone (nothing was sent)."""
        if self.transport is None or self.transport.is_closing():
            return False
        lengths = [len(f) for f in frames]
        head = _PREFIX.pack(4 * len(frames) + sum(lengths), len(frames))
        self.transport.writelines((head, struct.pack(f"<{len(frames)}I", *lengths), *frames))
        return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # what was sent this turn still leaves


def socket_path(address: str) -> str:
    """The filesystem path of an engine address (`unix:/run/ds/engine.sock` or the bare path)."""
    return address.removeprefix("unix:")


def pack(header: ToCore | ToFrontend, *arrays: np.ndarray | bytes) -> Frames:
    return [_encoder.encode(header), *(a if isinstance(a, bytes) else a.tobytes() for a in arrays)]


def unpack_to_core(frames: Sequence[bytes]) -> ToCore:
    message: ToCore = _to_core.decode(frames[0])
    return message


def unpack_to_frontend(frames: Sequence[bytes]) -> ToFrontend:
    message: ToFrontend = _to_frontend.decode(frames[0])
    return message


# -- encoder requests: sequences in, per-sequence outputs back -------------------------------------------


def encode_request(
    request_id: int,
    model: str,
    version: int,
    timeout_s: float,
    rows: Sequence[EncodedText],
    shadow: bool = False,
    traced: bool = False,
    priority: int = 0,
) -> Frames:
    lengths = [len(r) for r in rows]
    ids = np.concatenate([r.input_ids for r in rows]) if len(rows) > 1 else rows[0].input_ids
    types = np.concatenate([r.type_ids for r in rows]) if len(rows) > 1 else rows[0].type_ids
    header = Encode(request_id, model, version, timeout_s, lengths, shadow, traced, priority)
    return pack(header, ids.astype(np.int64, copy=False), types.astype(np.int64, copy=False))


def request_rows(message: Encode, frames: Sequence[bytes]) -> list[EncodedText]:
    """The sequences of an `Encode`, as the core's batcher takes them (views on the frames)."""
    ids = np.frombuffer(frames[1], dtype=np.int64)
    types = np.frombuffer(frames[2], dtype=np.int64)
    rows, at = [], 0
    for length in message.lengths:
        rows.append(EncodedText(ids[at : at + length], types[at : at + length], [], False))
        at += length
    return rows


def encode_outputs(
    request_id: int,
    outputs: Sequence[dict[str, np.ndarray]],
    queue_s: list[float],
    run_s: list[float],
    batches: list[int],
    core_s: float,
    spans: list[str] | None = None,
) -> Frames:
    specs, frames = [], []
    for name in outputs[0]:
        rows = [np.ascontiguousarray(o[name]) for o in outputs]
        specs.append(OutputSpec(name, rows[0].dtype.str, [r.shape for r in rows]))
        frames.append(b"".join(r.tobytes() for r in rows) if len(rows) > 1 else rows[0].tobytes())
    return pack(Encoded(request_id, specs, queue_s, run_s, batches, core_s, spans or []), *frames)


def result_rows(message: Encoded, frames: Sequence[bytes]) -> list[dict[str, np.ndarray]]:
    """Each sequence's outputs, by name (read-only views on the frames)."""
    results: list[dict[str, np.ndarray]] = [{} for _ in message.queue_s]
    for spec, frame in zip(message.outputs, frames[1:], strict=True):
        dtype = np.dtype(spec.dtype)
        flat = np.frombuffer(frame, dtype=dtype)
        at = 0
        for row, shape in zip(results, spec.shapes, strict=True):
            size = math.prod(shape)  # of a tuple of ints, ~20x cheaper than np.prod
            row[spec.name] = flat[at : at + size].reshape(shape)
            at += size
    return results
