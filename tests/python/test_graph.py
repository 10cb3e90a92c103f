"""Captures, graphs, replays (one at a time, pipelined, as sequences) and their errors, over
both stream transports."""

from __future__ import annotations

import numpy as np
import pytest

import replayd
from conftest import SAXPY, STEP

N = 256


def step_ref(x: np.ndarray, pos: int, times: int = 1) -> np.ndarray:
    for _ in range(times):
        x = x * np.float32(0.5) + np.float32(pos)
    return x


@pytest.fixture
def chain(any_session):
    """A graph of 4 step calls over x (input, named) with the variable pos, and y (output)
    = saxpy(x, x) with k = pos, plus a scratch buffer that becomes an internal."""
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    saxpy = s.program(SAXPY, "saxpy", "out,in,in,int32,int32,int32", core_id=True)
    x = s.array(np.zeros(N, np.float32), name="x")
    y = s.empty(N, name="y")
    with s.capture(inputs=[x], outputs=[y], pos=(1, 1000)) as cap:
        tmp = cap.scratch(N)
        for _ in range(4):
            s.launch(step, [x, N, "pos"], pos=1)
        s.copy(tmp, x)
        s.launch(saxpy, [y, tmp, x, N, "pos", 64], 4, pos=1)
    return s, cap.graph, x, y


def expected(x0: np.ndarray, pos: int):
    x = step_ref(x0, pos, 4)
    return x, x * np.float32(pos) + x


def test_a_capture_runs_and_becomes_a_graph_with_named_parameters(chain):
    s, g, x, y = chain
    assert [p.name for p in g.params] == ["x", "y", "pos"]
    assert g.params[0].is_buffer and g.params[0].bytes == 4 * N and g.params[0].default is x
    assert g.params[2].variable.min == 1 and g.params[2].variable.max == 1000
    assert g.calls == 6 and g.batches >= 1 and len(g.key) == 64
    assert g.arena_bytes >= 4 * N  # the scratch buffer is an internal
    # The capture ran its calls at pos 1.
    x1, y1 = expected(np.zeros(N, np.float32), 1)
    np.testing.assert_allclose(x.numpy(), x1, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), y1, rtol=1e-6)


def test_replay_returns_reads_as_arrays(chain):
    s, g, x, y = chain
    x0 = x.numpy()
    got_x, got_y = g.replay(pos=17, reads=[x, y])
    want_x, want_y = expected(x0, 17)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-6)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-6)
    # A single view answers a single array, of the view's shape and dtype.
    part = g.replay(pos=2, reads=y.view(shape=(4, 8), byte_offset=64))
    assert part.shape == (4, 8) and part.dtype == np.float32
    np.testing.assert_allclose(part.reshape(-1), expected(want_x, 2)[1][16:48], rtol=1e-6)
    assert g.replay(pos=3) is None
    assert g.replay(pos=3, wait=True) is None
    assert g.info().replays == 4


def test_replay_takes_other_buffers_by_name(chain):
    s, g, x, y = chain
    x2 = s.array(np.full(N, 8, np.float32))
    y2 = s.empty(N)
    x_before = x.numpy()
    got = g.replay(x=x2, y=y2, pos=5, reads=[x2, y2])
    want_x, want_y = expected(np.full(N, 8, np.float32), 5)
    np.testing.assert_allclose(got[0], want_x, rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), want_y, rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), x_before)  # the captured x is untouched


def test_replay_reads_past_1_mib_are_read_after_it(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    n = 1 << 19  # 2 MiB of floats
    x = s.array(np.ones(n, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 10)) as cap:
        s.launch(step, [x, n, "pos"], pos=1)
    got = cap.graph.replay(pos=2, reads=x)
    np.testing.assert_array_equal(got, np.full(n, 0.75 + 2, np.float32))


def test_replay_async_pipelines_past_the_window_in_order(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(8, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 1000)) as cap:
        s.launch(step, [x, 8, "pos"], pos=1)
    g = cap.graph
    x.write(np.zeros(8, np.float32))
    n = 3 * s.client.window + 5
    futures = [g.replay_async(pos=p, reads=x[:1]) for p in range(1, n + 1)]
    want = np.zeros(1, np.float32)
    for p, f in enumerate(futures, 1):
        want = step_ref(want, p)
        np.testing.assert_allclose(f.result(), want, rtol=1e-6)
        assert f.done() and f.exception() is None
    # A read after pipelined replays sees all of them (it waits for the stream first).
    g.replay_async(pos=1)
    np.testing.assert_allclose(x.numpy()[:1], step_ref(want, 1), rtol=1e-6)


def test_a_failed_replay_in_a_pipeline_fails_alone(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(4, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 10)) as cap:
        s.launch(step, [x, 4, "pos"], pos=1)
    g = cap.graph
    ok1 = g.replay_async(pos=1)
    bad = g.replay_async(pos=11)  # out of the variable's range
    after = g.replay_async(pos=2, reads=x)
    assert ok1.result() is None
    with pytest.raises(replayd.InvalidArgument, match="pos"):
        bad.result()
    assert isinstance(bad.exception(), replayd.InvalidArgument)
    # Sent before the failure was seen: the daemon answers it ABORTED, runs nothing.
    with pytest.raises(replayd.Aborted):
        after.result()
    # The next request resumes the stream. x ran the capture (pos 1), ok1 (pos 1), this (pos 3).
    want = step_ref(step_ref(step_ref(np.zeros(4, np.float32), 1), 1), 3)
    np.testing.assert_allclose(g.replay(pos=3, reads=x), want)


def test_sequence_steps_a_variable_and_streams_each_replays_reads(chain):
    s, g, x, y = chain
    x0 = x.numpy()
    seq = g.sequence(pos=range(1, 21), reads=[x[:4], y[:4]])
    got = list(seq)
    assert len(got) == 20 and seq.replays == 20 and seq.device_seconds >= 0
    want = x0
    for p, (gx, gy) in enumerate(got, 1):
        want, want_y = expected(want, p)
        np.testing.assert_allclose(gx, want[:4], rtol=1e-6)
        np.testing.assert_allclose(gy, want_y[:4], rtol=1e-6)
    # Steps of 3, a single read.
    seq = g.sequence(pos=range(2, 14, 3), reads=x[:2])
    firsts = [r[0] for r in seq]
    for p, v in zip(range(2, 14, 3), firsts):
        want = step_ref(want, p, 4)
        assert v == pytest.approx(want[0], rel=1e-6)


def test_sequence_of_vectors_and_without_reads(chain):
    s, g, x, y = chain
    y2 = s.empty(N)
    x0 = x.numpy()
    got = list(g.sequence(pos=[3, 1, 4], y=[y, y2, y], reads=[x[:1]]))
    want = x0
    for p, (gx,) in zip([3, 1, 4], got):
        want = step_ref(want, p, 4)
        np.testing.assert_allclose(gx, want[:1], rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), expected(step_ref(x0, 3, 4), 1)[1], rtol=1e-6)
    done = g.sequence(pos=range(1, 101)).wait()
    assert done.replays == 100
    assert list(g.sequence(pos=range(1, 3))) == []


def test_bad_replay_parameters_are_refused(chain):
    s, g, x, y = chain
    with pytest.raises(replayd.InvalidArgument, match="pos needs a value"):
        g.replay(reads=x)
    with pytest.raises(replayd.InvalidArgument, match="no parameter named z"):
        g.replay(pos=1, z=3)
    with pytest.raises(replayd.InvalidArgument, match="not an integer"):
        g.replay(pos=1.5)
    with pytest.raises(replayd.InvalidArgument, match="float32"):
        g.replay(pos=1, x=s.empty(N, np.int32))
    with pytest.raises(replayd.InvalidArgument, match="takes a buffer"):
        g.replay(pos=1, x=np.zeros(N, np.float32))
    # The daemon's checks: a value out of range, a buffer too small.
    with pytest.raises(replayd.InvalidArgument, match="pos"):
        g.replay(pos=1001)
    with pytest.raises(replayd.InvalidArgument):
        g.replay(pos=1, y=s.empty(N // 2))
    with pytest.raises(replayd.InvalidArgument):
        g.sequence(pos=range(995, 1005)).wait()  # past max: checked before the first runs
    with pytest.raises(replayd.InvalidArgument, match="range"):
        g.sequence(pos=5)
    with pytest.raises(replayd.InvalidArgument, match="lengths"):
        g.sequence(pos=[1, 2], y=[y])


def test_a_graph_of_a_closed_session_is_not_found(any_client):
    s = any_client.session("cpu:0")
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(4, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 4)) as cap:
        s.launch(step, [x, 4, "pos"], pos=1)
    s.close()
    with pytest.raises(replayd.NotFound):
        cap.graph.replay(pos=1)
    with pytest.raises(replayd.NotFound):
        cap.graph.sequence(pos=range(1, 3))


def test_an_error_in_the_capture_block_discards_it(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(4, np.float32), name="x")
    with pytest.raises(RuntimeError):
        with s.capture(inputs=[x], pos=(1, 4)) as cap:
            s.launch(step, [x, 4, "pos"], pos=1)
            raise RuntimeError("boom")
    with pytest.raises(replayd.FailedPrecondition):
        cap.graph
    # Not capturing any more: a new capture opens.
    with s.capture(inputs=[x], pos=(1, 4)) as cap2:
        s.launch(step, [x, 4, "pos"], pos=1)
    assert cap2.graph.calls == 1


def test_replay_while_capturing_is_a_failed_precondition(chain):
    s, g, x, y = chain
    step = s.program(STEP, "step", "inout,int32,int32")
    with pytest.raises(replayd.FailedPrecondition):
        with s.capture(inputs=[x], pos=(1, 4)):
            s.launch(step, [x, N, "pos"], pos=1)
            g.replay(pos=1)
    with pytest.raises(replayd.FailedPrecondition, match="already capturing"):
        with s.capture(inputs=[x]):
            with s.capture(inputs=[x]):
                pass
    with pytest.raises(replayd.InvalidArgument, match="range"):
        s.capture(inputs=[x], pos=5)
    with pytest.raises(replayd.InvalidArgument, match="twice"):
        with s.capture(inputs=[x, x]):
            pass


def test_the_same_structure_captured_again_is_a_graph_cache_hit(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    graphs = []
    for _ in range(2):
        x = s.array(np.zeros(16, np.float32), name="x")
        with s.capture(inputs=[x], pos=(1, 64)) as cap:
            s.launch(step, [x, 16, "pos"], "pos // 64 + 1", pos=7)
        graphs.append(cap.graph)
    assert not graphs[0].cache_hit and graphs[1].cache_hit
    assert graphs[0].key == graphs[1].key
    graphs[0].free()
    graphs[0].free()
    assert graphs[1].replay(pos=64, reads=x[:1]) is not None


def test_parameters_are_named_by_mapping_name_or_the_callers_variable(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    state = s.array(np.zeros(4, np.float32))  # named by this variable
    alias = s.empty(4)
    other = alias  # two names: not guessed
    named = s.empty(4, name="logits")
    with s.capture(inputs=[state, alias], outputs={"out": s.empty(4)}, pos=(1, 4)) as cap:
        s.launch(step, [state, 4, "pos"], pos=1)
    assert [p.name for p in cap.graph.params] == ["state", "in1", "out", "pos"]
    with s.capture(inputs=[named], pos=(1, 4)) as cap:
        s.launch(step, [named, 4, "pos"], pos=1)
    assert [p.name for p in cap.graph.params] == ["logits", "pos"]
    fresh = s.array(np.ones(4, np.float32))
    np.testing.assert_array_equal(cap.graph.replay(logits=fresh, pos=2, reads=fresh), np.full(4, 2.5, np.float32))
    assert other is alias


def test_a_buffer_named_as_a_variable_is_refused_and_its_graph_freed(any_session):
    s = any_session
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(4, np.float32))
    with pytest.raises(replayd.InvalidArgument, match="share a name"):
        with s.capture(inputs={"pos": x}, pos=(1, 4)):
            s.launch(step, [x, 4, "pos"], pos=1)
    with s.capture(inputs={"x": x}, pos=(1, 4)) as cap:  # the session is not capturing any more
        s.launch(step, [x, 4, "pos"], pos=1)
    assert cap.graph.cache_hit  # the same structure, still cached
