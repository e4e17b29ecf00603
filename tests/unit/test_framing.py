"""FrameBuffer and frame_end (mq.remoting.framing): a stream of frames cut at every possible
pair of places comes out as the same frames, whole frames are parsed where they lie, and a
length over FRAME_SIZE_MAX is refused as soon as its 4 bytes are there."""
import pytest

from mq.remoting.framing import FrameBuffer, frame_end
from mq.wire.errors import FrameError
from mq.wire.remoting import RemotingCommand, decode_frame_payload, encode_frame


def frames_of(reads: list[bytes]) -> list[RemotingCommand]:
    buf, out = FrameBuffer(), []
    for chunk in reads:
        data = buf.take(chunk)
        if data is None:
            continue
        pos, size = 0, len(data)
        while size - pos >= 4:
            end = frame_end(data, pos, size)
            if not end:
                break
            out.append(decode_frame_payload(memoryview(data)[pos + 4:end]))
            pos = end
        if pos < size:
            buf.hold(data, pos)
    assert len(buf) == 0
    return out


def test_every_cut_gives_the_same_frames():
    cmds = [RemotingCommand(code=10 + i, opaque=i, ext_fields={"k": "v" * i}, body=b"b" * (3 * i)) for i in range(3)]
    stream = b"".join(encode_frame(c) for c in cmds)
    for a in range(len(stream) + 1):
        for b in range(a, len(stream) + 1, 7):
            assert frames_of([stream[:a], stream[a:b], stream[b:]]) == cmds, (a, b)


def test_whole_frames_are_not_copied_and_a_huge_length_is_refused_early():
    frame = encode_frame(RemotingCommand(code=1))
    buf = FrameBuffer()
    data = frame + frame
    assert buf.take(data) is data                       # nothing held: parsed in place
    with pytest.raises(FrameError):
        frame_end((0x7FFFFFFF).to_bytes(4, "big"), 0, 4)
    assert frame_end(frame, 0, len(frame) - 1) == 0     # one byte short: not whole yet
    buf.hold(frame[:3])
    assert not buf.ready() and buf.take(frame[3:5]) is None
    buf.add(frame[5:])                                  # a paused reader keeps bytes unparsed
    assert buf.ready() and buf.take(b"") == frame
