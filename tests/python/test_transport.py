"""The transports that carry a session's stream (replayd.stream): which one `auto` picks,
and what each does when the daemon goes away or a session is dropped mid-pipeline."""

from __future__ import annotations

import gc
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
