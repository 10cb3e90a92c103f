"""The transports that carry a session's stream (replayd.stream): which one `auto` picks,
and what each does when the daemon goes away or a session is dropped mid-pipeline."""

from __future__ import annotations

import _thread
import gc
import random
import threading

import numpy as np
import pytest

import replayd
import replayd.stream
from conftest import STEP, TRANSPORTS, Daemon, require_transport

N = 1024


def capture_chain(s: replayd.Session, calls: int = 8):
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(N, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 1 << 20)) as cap:
        for _ in range(calls):
            s.launch(step, [x, N, "pos"], pos=1)
    return cap.graph, x


def test_auto_carries_streams_natively_where_the_native_transport_is_built(daemon):
    with replayd.connect(daemon.address) as c, c.session("cpu:0") as s:
        g, x = capture_chain(s)
        g.replay(pos=1, wait=True)
        expected = "native" if replayd.stream.native_available() else "direct"
        assert s._stream.transport.name == expected


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_native_transports_replies_match_the_others(daemon, transport):
    """The same pipeline of replays, each read checked, over each transport."""
    require_transport(transport)
    with replayd.connect(daemon.address, transport=transport, window=16) as c, c.session("cpu:0") as s:
        g, x = capture_chain(s, calls=1)
        assert s._stream is not None and s._stream.transport.name == transport
        value = x.numpy()  # the capture ran its launch once
        futures = [g.replay_async(pos=p, reads=x) for p in range(1, 101)]
        for p, f in zip(range(1, 101), futures):
            value = value * np.float32(0.5) + np.float32(p)
            np.testing.assert_array_equal(f.result(), value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_daemon_that_stops_mid_pipeline_fails_what_is_outstanding_as_unavailable(transport):
    require_transport(transport)
    d = Daemon()
    try:
        with replayd.connect(d.address, transport=transport, window=8) as c:
            s = c.session("cpu:0")
            g, x = capture_chain(s, calls=32)
            assert g.replay(pos=1, reads=x).shape == (N,)
            futures = [g.replay_async(pos=p) for p in range(1, 5)]
            d.process.kill()
            d.process.wait()
            outcomes = []
            for f in futures:
                try:
                    f.result()
                    outcomes.append("ok")
                except replayd.Unavailable:
                    outcomes.append("unavailable")
            # Those that ran before the kill may have answered; every one after failed.
            assert outcomes == sorted(outcomes, key=lambda o: o != "ok"), outcomes
            with pytest.raises(replayd.Unavailable):
                g.replay(pos=1, wait=True)
    finally:
        d.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_session_dropped_mid_pipeline_leaves_the_client_usable(daemon, transport):
    """A session garbage-collected with replays outstanding breaks its stream without
    waiting; the client's next session works."""
    require_transport(transport)
    with replayd.connect(daemon.address, transport=transport, window=64) as c:
        s = c.session("cpu:0")
        g, x = capture_chain(s, calls=32)
        futures = [g.replay_async(pos=p) for p in range(1, 41)]
        del s, g, x, futures
        gc.collect()
        with c.session("cpu:0") as s2:
            g2, x2 = capture_chain(s2, calls=1)
            before = x2.numpy()
            np.testing.assert_array_equal(g2.replay(pos=3, reads=x2), before * np.float32(0.5) + np.float32(3))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_threads_waiting_on_one_stream_each_get_their_own_replies(daemon, transport):
    """While one thread holds the read turn (blocked in the transport's poll), others send
    and wait on the same stream; each sees its own replay's reads."""
    require_transport(transport)
    with replayd.connect(daemon.address, transport=transport, window=4) as c, c.session("cpu:0") as s:
        buffers = [s.array(np.full(16, i, np.float32), name=f"b{i}") for i in range(6)]
        add = s.program("void add(float *x, int n, int k) { for (int i = 0; i < n; ++i) x[i] += (float)k; }",
                        "add", "inout,int32,int32")
        with s.capture(inputs={"b": buffers[0]}, k=(0, 1000)) as cap:
            s.launch(add, [buffers[0], 16, "k"], k=0)
        g = cap.graph
        failures = []

        def worker(i: int) -> None:
            try:
                total = float(i)
                for k in range(1, 30):
                    total += k
                    got = g.replay(b=buffers[i], k=k, reads=buffers[i])
                    if not np.array_equal(got, np.full(16, total, np.float32)):
                        failures.append((i, k, got[:2]))
            except Exception as e:  # noqa: BLE001 (reported below)
                failures.append((i, repr(e)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert failures == []


def native_module():
    require_transport("native")
    from replayd import _transport
    return _transport


@pytest.mark.parametrize("case", range(200))
def test_the_native_replay_encoding_is_the_protobuf_messages(case):
    """encode_replay's bytes parse as the SessionRequest the protobuf module builds, for
    random handles, integers (negative and 64-bit ones too), flags and views."""
    from replayd._stubs import pb
    t = native_module()
    rng = random.Random(case)

    def u64() -> int:
        return rng.choice([0, 1, 127, 128, 300, 1 << 32, (1 << 64) - 1, rng.randrange(1 << 64)])

    kinds = bytes(rng.choice(b"bi") for _ in range(rng.randrange(6)))
    values = [u64() if k == ord("b") else rng.choice([0, -1, 5, -(1 << 63), (1 << 63) - 1, rng.randrange(-(1 << 63), 1 << 63)])
              for k in kinds]
    reads = [(u64(), u64(), u64()) for _ in range(rng.randrange(4))]
    seq, session, resume, graph, wait = u64(), u64(), bool(case % 2), u64(), bool(case % 3)
    data = t.encode_replay(seq, session, resume, graph, values, kinds, wait, reads)

    want = pb.SessionRequest(seq=seq, session=session, resume=resume)
    want.replay.graph = graph
    want.replay.wait = wait
    for k, v in zip(kinds, values):
        want.replay.params.add(**({"buffer": v} if k == ord("b") else {"int_value": v}))
    for b, o, n in reads:
        want.replay.reads.add(buffer=b, offset=o, length=n)
    assert pb.SessionRequest.FromString(data) == want
    assert want.HasField("replay")
    # The other transports' encoding of the same request.
    other = replayd.stream.ReplayRequest(graph, values, kinds, wait, reads).proto()
    other.seq, other.session, other.resume = seq, session, resume
    assert other == want


def test_the_native_replay_reply_decoding_is_the_protobuf_messages():
    from replayd._stubs import pb
    t = native_module()
    reply = pb.SessionReply(seq=(1 << 40) + 3, final=True)
    reply.replay.device_seconds = 0.125
    reply.replay.reads.extend([bytes(range(16)), b"\x01" * 4096])
    outputs = [np.zeros(16, np.uint8), np.zeros(1024, np.float32)]
    decoded = t.decode_replay_reply(reply.SerializeToString(), outputs)
    assert decoded == ((1 << 40) + 3, 0, "", True, 0.125)
    assert (decoded.seq, decoded.code, decoded.final, decoded.device_seconds) == ((1 << 40) + 3, 0, True, 0.125)
    np.testing.assert_array_equal(outputs[0], np.arange(16, dtype=np.uint8))
    assert outputs[1].tobytes() == b"\x01" * 4096

    failed = pb.SessionReply(seq=9, code=3, message="graph 7: variable pos=0 is outside [1, 8]", final=True)
    untouched = [np.full(4, 7, np.uint8)]
    assert t.decode_replay_reply(failed.SerializeToString(), untouched) == (
        9, 3, "graph 7: variable pos=0 is outside [1, 8]", True, 0.0)
    np.testing.assert_array_equal(untouched[0], np.full(4, 7, np.uint8))

    # Fields it does not know (a newer daemon's) are skipped, whatever their wire type.
    unknown = b"\x28\x05" + b"\x31" + bytes(8) + b"\x3d" + bytes(4) + b"\xfa\x01\x02ab"
    assert t.decode_replay_reply(unknown + reply.SerializeToString(), outputs)[:2] == ((1 << 40) + 3, 0)

    with pytest.raises(ValueError, match="not a SessionReply"):
        t.decode_replay_reply(b"\x0a\x05ab", outputs)  # a length past the end
    with pytest.raises(ValueError, match="2 reads for 1 outputs"):
        t.decode_replay_reply(reply.SerializeToString(), outputs[:1])
    with pytest.raises(ValueError, match="answered 16 bytes for an output of 32"):
        t.decode_replay_reply(reply.SerializeToString(), [np.zeros(32, np.uint8), outputs[1]])
    with pytest.raises(BufferError):  # an output that cannot be written
        t.decode_replay_reply(reply.SerializeToString(), [bytes(16), outputs[1]])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_replay_the_daemon_refuses_fails_alone_and_the_stream_resumes(daemon, transport):
    """The round trip of one replay (on the native transport encoded and decoded in C++): a
    refusal raises the daemon's error and leaves the reads' arrays out; the next replay runs,
    and replays queued behind pending ones take the general path in order."""
    require_transport(transport)
    with replayd.connect(daemon.address, transport=transport) as c, c.session("cpu:0") as s:
        g, x = capture_chain(s, calls=1)
        before = x.numpy()
        with pytest.raises(replayd.InvalidArgument, match="pos"):
            g.replay(pos=0, reads=x)  # below the capture's range: the daemon refuses it
        np.testing.assert_array_equal(x.numpy(), before)
        got = g.replay(pos=2, reads=[x, x[:4]])
        want = before * np.float32(0.5) + np.float32(2)
        np.testing.assert_array_equal(got[0], want)
        np.testing.assert_array_equal(got[1], want[:4])
        futures = [g.replay_async(pos=p) for p in (3, 4)]
        last = g.replay(pos=5, reads=x[8:16], wait=True)  # behind the two: in order
        for p in (3, 4, 5):
            want = want * np.float32(0.5) + np.float32(p)
        assert all(f.result() is None for f in futures)
        np.testing.assert_array_equal(last, want[8:16])


def test_ctrl_c_interrupts_a_native_replay_and_the_stream_goes_on(daemon):
    """A KeyboardInterrupt while a replay runs long reaches the waiting thread; the replay's
    reply, still due, is read and dropped, and the session's next replay answers its own."""
    require_transport("native")
    spin = r"""
void spin(float *x, int n, int rounds) {
  volatile long k = 0;
  for (long i = 0; i < (long)rounds * 1000000L; ++i) k += i;
  x[0] = (float)n;
}"""
    with replayd.connect(daemon.address, transport="native") as c, c.session("cpu:0") as s:
        program = s.program(spin, "spin", "inout,int32,int32")
        x = s.array(np.zeros(4, np.float32), name="x")
        with s.capture(inputs=[x], n=(0, 100), rounds=(0, 100000)) as cap:
            s.launch(program, [x, "n", "rounds"], n=0, rounds=0)
        g = cap.graph
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            g.replay(n=7, rounds=2000, reads=x)  # seconds of spinning
        timer.join()
        # Interrupted while waiting: the reply has not come yet, and is awaited as any other.
        assert [op.finished for op in s._stream._pending] == [False]
        np.testing.assert_array_equal(g.replay(n=9, rounds=0, reads=x), [9, 0, 0, 0])
