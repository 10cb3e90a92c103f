"""Sessions, buffers and views to and from numpy, programs, launches, copies, and the
errors of each, against a daemon of this build."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import replayd
from conftest import SAXPY, STEP, Daemon


def free_memory(client: replayd.Client) -> int:
    return client.device("cpu:0").free_memory


def test_devices_lists_cpu0_with_its_formats_and_limits(client):
    devices = client.devices()
    cpu = [d for d in devices if d.id == "cpu:0"]
    assert len(cpu) == 1
    d = cpu[0]
    assert d.kind == "cpu" and "cpu-c" in d.formats and d.source_format == "cpu-c"
    assert d.total_memory == 1 << 30 and 0 < d.free_memory <= d.total_memory
    assert d.limits.max_global_total > 0 and d.limits.max_args > 0
    with pytest.raises(replayd.NotFound, match="cuda:7"):
        client.device("cuda:7")


def test_a_session_closes_at_the_end_of_its_block_and_frees_what_it_owned(client):
    before = free_memory(client)
    with client.session("cpu:0") as s:
        x = s.empty((1 << 20,), np.float32)
        assert free_memory(client) == before - (4 << 20)
        assert s.tenant == "default" and s.lease_seconds > 0 and not s.closed
    assert s.closed
    assert free_memory(client) == before
    # Closed here, so the client says NotFound as the daemon would.
    with pytest.raises(replayd.NotFound, match="closed"):
        x.numpy()
    with pytest.raises(replayd.NotFound):
        s.empty(4)
    s.close()  # idempotent


def test_an_error_in_the_block_still_closes_the_session(client):
    with pytest.raises(ZeroDivisionError):
        with client.session("cpu:0") as s:
            s.empty(16)
            1 / 0
    assert s.closed


def test_unknown_device_is_not_found(client):
    with pytest.raises(replayd.NotFound) as e:
        client.session("cpu:9")
    assert e.value.code.name == "NOT_FOUND" and "cpu:9" in e.value.message


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint16, np.int32, np.int64, np.complex64])
def test_arrays_round_trip_with_their_shape_and_dtype(session, dtype):
    a = (np.arange(3 * 5 * 7) % 101).astype(dtype).reshape(3, 5, 7)
    buf = session.array(a)
    assert buf.shape == (3, 5, 7) and buf.dtype == np.dtype(dtype) and buf.nbytes == a.nbytes
    got = buf.numpy()
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got, a)


def test_non_contiguous_and_array_like_input_is_copied_in_order(session):
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_array_equal(session.array(a.T).numpy(), a.T)
    np.testing.assert_array_equal(session.array([[1, 2], [3, 4]]).numpy(), np.array([[1, 2], [3, 4]]))


def test_empty_buffers_start_zeroed(session):
    b = session.empty((4, 4), np.int32)
    np.testing.assert_array_equal(b.numpy(), np.zeros((4, 4), np.int32))


def test_views_read_and_write_at_their_offsets(session):
    buf = session.array(np.arange(40, dtype=np.float32).reshape(10, 4))
    row = buf[3]
    assert row.shape == (4,) and row.offset == 3 * 16
    np.testing.assert_array_equal(row.numpy(), [12, 13, 14, 15])
    buf[2:5].write(np.full((3, 4), -1, np.float32))
    want = np.arange(40, dtype=np.float32).reshape(10, 4)
    want[2:5] = -1
    np.testing.assert_array_equal(buf.numpy(), want)
    assert buf[-1].offset == 9 * 16
    # Reinterpreting bytes: the second half of the buffer as int32.
    half = buf.view(shape=(20,), dtype=np.int32, byte_offset=80)
    np.testing.assert_array_equal(half.numpy(), want.reshape(-1)[20:].view(np.int32))
    tail = buf.view(byte_offset=120)
    assert tail.shape == (10,) and tail.nbytes == 40


def test_views_past_the_buffer_or_strided_are_refused(session):
    buf = session.empty(16, np.float32)
    with pytest.raises(replayd.InvalidArgument, match="past"):
        buf.view(shape=(8,), byte_offset=40)
    with pytest.raises(replayd.InvalidArgument, match="step"):
        buf[::2]
    with pytest.raises(IndexError):
        buf[16]
    with pytest.raises(replayd.InvalidArgument):
        buf.view(byte_offset=65)


def test_writes_of_the_wrong_dtype_or_shape_are_refused_and_change_nothing(session):
    buf = session.array(np.ones(8, np.float32))
    with pytest.raises(replayd.InvalidArgument, match="float64") as e:
        buf.write(np.zeros(8))
    assert isinstance(e.value, ValueError) and e.value.code.name == "INVALID_ARGUMENT"
    with pytest.raises(replayd.InvalidArgument, match=r"shape \(4,\)"):
        buf.write(np.zeros(4, np.float32))
    with pytest.raises(replayd.InvalidArgument, match="shape"):
        buf.write(np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(buf.numpy(), np.ones(8, np.float32))


def test_a_256_mib_buffer_round_trips_in_chunks(session):
    n = (256 << 20) // 8
    a = np.arange(n, dtype=np.int64) * 7919
    buf = session.array(a)
    assert buf.nbytes == 256 << 20
    got = buf.numpy()
    assert got.shape == a.shape and np.array_equal(got, a)
    # A window across chunk boundaries, at an odd byte offset.
    w = buf.view(shape=(3 << 18,), dtype=np.uint8, byte_offset=(1 << 20) - 5)
    np.testing.assert_array_equal(w.numpy(), a.view(np.uint8)[(1 << 20) - 5:(1 << 20) - 5 + (3 << 18)])


def test_memory_past_the_device_is_resource_exhausted(session):
    with pytest.raises(replayd.ResourceExhausted):
        session.empty(2 << 30, np.uint8)


def test_launch_runs_a_kernel_with_core_ids_and_waits_with_its_device_time(session):
    saxpy = session.program(SAXPY, "saxpy", signature="out:out,in:a,in:b,int32:n,int32:k,int32:chunk", core_id=True)
    assert saxpy.format == "cpu-c" and len(saxpy.key) == 64 and saxpy.handle > 0
    a = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    out, da, db = session.empty(1000), session.array(a), session.array(b)
    assert session.launch(saxpy, [out, da, db, 1000, 3, 128], (1000 + 127) // 128) is None
    np.testing.assert_allclose(out.numpy(), a * 3 + b, rtol=1e-6)
    seconds = session.launch(saxpy, [out, da, db, 1000, -1, 128], 8, wait=True)
    assert seconds is not None and seconds >= 0
    np.testing.assert_allclose(out.numpy(), b - a, rtol=1e-6)
    # The same source again comes from the compile cache.
    again = session.program(SAXPY, "saxpy", "out,in,in,int32,int32,int32", core_id=True)
    assert again.cache_hit and again.compile_seconds == 0 and again.key == saxpy.key


def test_launch_takes_views_expressions_and_variables(session):
    saxpy = session.program(SAXPY, "saxpy", "out,in,in,int32,int32,int32", core_id=True)
    a = session.array(np.arange(64, dtype=np.float32))
    out = session.empty(64)
    # Elements 16..47 only, through views; n and the grid as expressions of a variable.
    session.launch(saxpy, [out[16:48], a[16:48], a[16:48], "m * 8", 2, 8], "m", m=4)
    want = np.zeros(64, np.float32)
    want[16:48] = np.arange(16, 48) * 3
    np.testing.assert_array_equal(out.numpy(), want)


def test_launch_async_returns_futures_in_order(session):
    step = session.program(STEP, "step", "inout,int32,int32")
    x = session.array(np.zeros(16, np.float32))
    futures = [session.launch_async(step, [x, 16, p]) for p in range(1, 6)]
    assert [f.result() for f in futures] == [None] * 5
    want = np.zeros(16, np.float32)
    for p in range(1, 6):
        want = want * np.float32(0.5) + np.float32(p)
    np.testing.assert_array_equal(x.numpy(), want)


def test_compile_errors_carry_the_compilers_diagnostics(session):
    with pytest.raises(replayd.InvalidArgument) as e:
        session.program("void broken(float *x) { x[0] = undeclared; }", "broken", "inout")
    assert "undeclared" in e.value.message and "error" in e.value.message


def test_bad_launches_are_refused_before_they_run(session):
    saxpy = session.program(SAXPY, "saxpy", "out,in,in,int32,int32,int32", core_id=True)
    a = session.array(np.ones(8, np.float32))
    with pytest.raises(replayd.InvalidArgument, match="3 arguments, the signature has 6"):
        session.launch(saxpy, [a, a, a], 1)
    with pytest.raises(replayd.InvalidArgument, match="session.array"):
        session.launch(saxpy, [a, np.ones(8, np.float32), a, 8, 1, 8], 1)
    with pytest.raises(replayd.InvalidArgument, match="integer parameter"):
        session.launch(saxpy, [a, a, a, 8.5, 1, 8], 1)
    with pytest.raises(replayd.InvalidArgument, match="at least 1"):
        session.launch(saxpy, [a, a, a, 8, 1, 8], 0)
    with pytest.raises(replayd.InvalidArgument, match="signature"):
        session.program(SAXPY, "saxpy", "out,in,float")
    # The daemon's own checks: a view past the buffer, an expression over an unbound variable.
    with pytest.raises(replayd.InvalidArgument):
        session.launch(saxpy, [a, a, a, "q", 1, 8], 1)
    # The session goes on after each failure.
    session.launch(saxpy, [a, a, a, 8, 1, 8], 1)
    np.testing.assert_array_equal(a.numpy(), np.full(8, 2, np.float32))


def test_copy_between_views(session):
    src = session.array(np.arange(32, dtype=np.float32))
    dst = session.empty(32)
    session.copy(dst[8:16], src[0:8])
    session.copy(dst[0:4], src[28:32], wait=True)
    want = np.zeros(32, np.float32)
    want[8:16] = np.arange(8)
    want[0:4] = np.arange(28, 32)
    np.testing.assert_array_equal(dst.numpy(), want)
    with pytest.raises(replayd.InvalidArgument, match="lengths differ"):
        session.copy(dst[0:4], src[0:8])
    with pytest.raises(replayd.InvalidArgument):
        session.copy(src[0:8], src[4:12])  # overlapping ranges of one buffer


def test_freed_and_collected_handles_are_freed_on_the_daemon(client, session):
    before = free_memory(client)
    b = session.empty(1 << 20, np.float32)
    b.free()
    b.free()
    assert free_memory(client) == before
    with pytest.raises(replayd.NotFound):
        session.launch(session.program(STEP, "step", "inout,int32,int32"), [b, 4, 1])
    c = session.empty(1 << 20, np.float32)
    assert free_memory(client) == before - (4 << 20)
    del c
    gc.collect()
    session.synchronize()  # a call of the session frees what was collected
    session.keep_alive()
    assert free_memory(client) == before


def test_session_stays_usable_after_a_stream_error(any_session):
    step = any_session.program(STEP, "step", "inout,int32,int32")
    x = any_session.array(np.zeros(4, np.float32))
    with pytest.raises(replayd.InvalidArgument):
        any_session.launch(step, [x, 4, "nope"])
    any_session.launch(step, [x, 4, 2])
    np.testing.assert_array_equal(x.numpy(), np.full(4, 2, np.float32))


def test_a_session_closed_by_the_lease_is_not_found(daemon):
    # A daemon of its own with a 1-second lease.
    d = Daemon(["--lease_seconds=1"])
    try:
        with replayd.connect(d.address) as c:
            s = c.session("cpu:0")
            x = s.empty(4)
            assert s.lease_seconds == 1
            deadline = time.monotonic() + 15
            while True:
                time.sleep(0.5)
                try:
                    x.numpy()  # renews the lease while it lives
                except replayd.NotFound:
                    break
                assert time.monotonic() < deadline, "the lease never expired"
                time.sleep(1.5)
            with pytest.raises(replayd.NotFound):
                s.close()
    finally:
        d.stop()


def test_closing_the_client_closes_its_sessions(daemon):
    c = replayd.connect(daemon.address)
    s = c.session("cpu:0")
    step = s.program(STEP, "step", "inout,int32,int32")
    x = s.array(np.zeros(4, np.float32), name="x")
    with s.capture(inputs=[x], pos=(1, 9)) as cap:
        s.launch(step, [x, 4, "pos"], pos=1)
    pending = cap.graph.replay_async(pos=2, reads=x)
    with c:
        pass
    assert c.closed and s.closed
    np.testing.assert_array_equal(pending.result(), np.full(4, 2.5, np.float32))  # answered before the close
    with pytest.raises(replayd.NotFound):
        cap.graph.replay(pos=3)
    with pytest.raises(replayd.Unavailable, match="closed"):
        c.session("cpu:0")
    with replayd.connect(daemon.address) as other:
        assert all(d.free_memory == d.total_memory for d in other.devices())
