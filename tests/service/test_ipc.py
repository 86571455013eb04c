"""The frontend <-> engine core messages: what goes in comes out, whole, however the bytes arrive."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from service import ipc
from service.generation.sampling import SamplingParams
from service.tokenization import EncodedText


def row(ids: list[int], types: list[int] | None = None) -> EncodedText:
    return EncodedText(
        np.array(ids, dtype=np.int64), np.array(types or [0] * len(ids), dtype=np.int64), [], False
    )


def test_a_request_s_sequences_arrive_as_they_were_sent() -> None:
    rows = [row([101, 7, 8, 102]), row([101, 9, 102, 5, 6, 102], [0, 0, 0, 1, 1, 1]), row([101, 102])]
    frames = ipc.encode_request(42, "sentiment", 3, 1.5, rows)
    message = ipc.unpack_to_core(frames)
    assert isinstance(message, ipc.Encode)
    assert (message.id, message.model, message.version, message.timeout_s) == (42, "sentiment", 3, 1.5)
    got = ipc.request_rows(message, frames)
    assert [r.input_ids.tolist() for r in got] == [r.input_ids.tolist() for r in rows]
    assert [r.type_ids.tolist() for r in got] == [r.type_ids.tolist() for r in rows]
    assert [len(r) for r in got] == [4, 6, 2]


def test_outputs_of_every_shape_and_dtype_come_back_per_sequence() -> None:
    rng = np.random.default_rng(0)
    outputs: list[dict[str, np.ndarray]] = [
        {"start_logits": rng.standard_normal(n).astype(np.float32), "probs": rng.random(3)} for n in (5, 2, 9)
    ]
    frames = ipc.encode_outputs(7, outputs, [0.1, 0.2, 0.3], [1.0, 1.0, 2.0], [4, 4, 5], 0.004)
    message = ipc.unpack_to_frontend(frames)
    assert isinstance(message, ipc.Encoded)
    assert (message.batches, message.core_s) == ([4, 4, 5], 0.004)
    back = ipc.result_rows(message, frames)
    for sent, got in zip(outputs, back, strict=True):
        for name, array in sent.items():
            assert got[name].dtype == array.dtype and got[name].shape == array.shape
            np.testing.assert_array_equal(got[name], array)


def test_generation_requests_keep_their_sampling_parameters() -> None:
    params = SamplingParams(max_new_tokens=9, temperature=0.7, top_k=5, seed=3, stop=("\n", "END"))
    message = ipc.unpack_to_core(ipc.pack(ipc.Generate(1, "lm", 2, [5, 6, 7], params)))
    assert isinstance(message, ipc.Generate) and message.params == params and message.prompt == [5, 6, 7]


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def writelines(self, parts: list[Any]) -> None:
        self.written.append(b"".join(bytes(p) for p in parts))

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def sent_in_one_turn(messages: list[list[bytes]]) -> FakeTransport:
    """What a channel writes for `messages` sent during one turn of the event loop."""

    async def main() -> FakeTransport:
        sender, transport = ipc.Channel(lambda c, f: None), FakeTransport()
        sender.connection_made(transport)  # type: ignore[arg-type]
        for m in messages:
            assert sender.send(m)
        assert transport.written == []  # they leave at the end of the turn
        await asyncio.sleep(0)
        return transport

    return asyncio.run(main())


def test_messages_sent_in_one_turn_of_the_loop_leave_in_one_write() -> None:
    assert len(sent_in_one_turn([[b"one"], [b"two", b"2"], [b"three"]]).written) == 1


def test_a_channel_rebuilds_messages_from_any_split_of_the_byte_stream() -> None:
    got: list[list[bytes]] = []
    receiver = ipc.Channel(lambda c, f: got.append(f))
    messages = [[b"header", b"x" * 1000], [b""], [b"a", b"", b"bc"]]
    stream = b"".join(sent_in_one_turn(messages).written)
    for size in (1, 3, 7, len(stream)):  # byte by byte, odd chunks, all at once
        got.clear()
        for at in range(0, len(stream), size):
            receiver.data_received(stream[at : at + size])
        assert got == messages


def test_a_channel_drops_a_connection_that_announces_an_absurd_message() -> None:
    receiver = ipc.Channel(lambda c, f: None)
    transport = FakeTransport()
    receiver.transport = transport  # type: ignore[assignment]
    receiver.data_received(ipc._PREFIX.pack(ipc.MAX_MESSAGE + 1, 1))
    assert transport.aborted
    lost: list[ipc.Channel] = []
    gone = ipc.Channel(lambda c, f: None, lost.append)
    gone.connection_lost(None)
    assert lost == [gone] and not gone.send([b"x"])
