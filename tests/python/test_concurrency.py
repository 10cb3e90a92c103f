"""Sessions used from many threads at once: each with its own, and several sharing one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import replayd
from conftest import STEP

THREADS = 8


def step_ref(x: np.ndarray, pos: int) -> np.ndarray:
    return x * np.float32(0.5) + np.float32(pos)


def run_one_session(client: replayd.Client, seed: int) -> int:
    """Captures a chain in a session of its own and checks replays, pipelined replays and a
    sequence against numpy; returns the replays checked."""
    with client.session("cpu:0") as s:
        step = s.program(STEP, "step", "inout,int32,int32")
        start = np.random.default_rng(seed).standard_normal(64).astype(np.float32)
        x = s.array(start, name="x")
        with s.capture(inputs=[x], pos=(1, 1000)) as cap:
            s.launch(step, [x, 64, "pos"], pos=1)
        g = cap.graph
        want = step_ref(start, 1)
        for p in range(1, 21):
            want = step_ref(want, p)
            np.testing.assert_allclose(g.replay(pos=p, reads=x), want, rtol=1e-6)
        futures = [g.replay_async(pos=p, reads=x[:8]) for p in range(1, 41)]
        for p, f in enumerate(futures, 1):
            want = step_ref(want, p)
            np.testing.assert_allclose(f.result(), want[:8], rtol=1e-6)
        for p, got in zip(range(5, 25), g.sequence(pos=range(5, 25), reads=x)):
            want = step_ref(want, p)
            np.testing.assert_allclose(got, want, rtol=1e-6)
        return 80


def test_sessions_of_their_own_from_many_threads(any_client):
    with ThreadPoolExecutor(THREADS) as pool:
        done = list(pool.map(lambda i: run_one_session(any_client, i), range(THREADS)))
    assert done == [80] * THREADS


def test_one_session_shared_by_threads(any_session):
    """Threads pipeline replays of their own graphs on one session's stream, each waiting
    on its own futures while others read; every result is its own."""
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    graphs = []
    for t in range(THREADS):
        x = s.array(np.full(16, t, np.float32), name="x")
        with s.capture(inputs=[x], pos=(1, 1000)) as cap:
            s.launch(step, [x, 16, "pos"], pos=1)
        graphs.append((cap.graph, x, step_ref(np.full(16, t, np.float32), 1)))
    errors = []
    barrier = threading.Barrier(THREADS)

    def work(t: int) -> None:
        g, x, want = graphs[t]
        try:
            barrier.wait()
            futures = [g.replay_async(pos=p, reads=x) for p in range(1, 101)]
            for p, f in enumerate(futures, 1):
                want = step_ref(want, p)
                np.testing.assert_allclose(f.result(), want, rtol=1e-6)
            for p in range(1, 11):
                want = step_ref(want, p)
                np.testing.assert_allclose(g.replay(pos=p, reads=x), want, rtol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert errors == []
