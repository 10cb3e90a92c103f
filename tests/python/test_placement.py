"""Sessions placed across real daemons on loopback ports (replayd.Daemons): each goes to the
serving daemon with the most free memory on a device of the kind asked for and keeps its
calls there; a daemon draining, one that does not answer, a name that does not resolve and a
daemon that refuses the session are passed over, and when none takes it the error says why
for each. As tests/integration/placement_test.cc for the C++ client."""

from __future__ import annotations

import shutil
import socket
from typing import Callable, Dict, Iterator, List, Optional

import grpc
import numpy as np
import pytest

import replayd
from conftest import STEP, Daemon, make_certificates, tenant
from replayd.v1 import admin_pb2, admin_pb2_grpc

MiB = 1 << 20

# Far past any daemon's answer on a loaded machine: these tests check where sessions go, and
# a daemon skipped as slow would make them fail by chance. Silent ports refuse at once.
PROBE = 60.0


def memory_limit(mib: int) -> str:
    return f"--cpu_memory_limit={mib * MiB}"


def free_port() -> int:
    """A loopback port nothing listens on (one the kernel just handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_of(address: str) -> str:
    return address.rsplit(":", 1)[1]


def drain(d: Daemon) -> None:
    """Begins `d`'s drain through Admin.Drain, as an operator would; its health is
    NOT_SERVING when the call returns."""
    with grpc.insecure_channel(d.address) as channel:
        reply = admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest())
    assert not reply.already_draining


def by_target(survey: List[replayd.DaemonState]) -> Dict[str, replayd.DaemonState]:
    states = {d.target: d for d in survey}
    assert len(states) == len(survey), f"a daemon twice in the survey: {survey}"
    return states


def cpu_free_memory(d: replayd.DaemonState) -> int:
    assert d.ok, f"{d.target}: {d.error}"
    [cpu] = [device for device in d.devices if device.kind == "cpu"]
    return cpu.free_memory


@pytest.fixture
def start() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of the build; each is stopped at the end of the test."""
    started: List[Daemon] = []

    def start_one(*args: str, tenants: Optional[str] = None) -> Daemon:
        d = Daemon(list(args), tenants=tenants)
        started.append(d)
        return d

    yield start_one
    for d in started:
        d.stop()


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv("REPLAYD_TOKEN", raising=False)


def test_a_session_goes_to_the_serving_daemon_with_the_most_free_memory(start):
    a, b, c = start(memory_limit(64)), start(memory_limit(256), "--drain_seconds=600"), start(memory_limit(128))
    with replayd.Daemons([a.address, b.address, c.address], probe_timeout=PROBE) as daemons:
        # All serving: b has the most.
        on_b = daemons.session("cpu")
        assert (on_b.target, on_b.device.id, on_b.device.kind) == (b.address, "cpu:0", "cpu")

        # b drains (its open session keeps it draining rather than gone): c is next.
        drain(b)
        of_b = daemons.client_of(b.address)
        assert (of_b.health(), of_b.health("replayd.v1.Admin")) == ("NOT_SERVING", "SERVING")
        assert daemons.client_of(c.address).health() == "SERVING"
        with pytest.raises(replayd.NotFound):
            of_b.health("no.such.Service")
        with pytest.raises(replayd.Unavailable, match="draining"):
            of_b.session("cpu:0")
        first = daemons.session("cpu")
        assert first.target == c.address

        # The session's calls stay on c: 100 MiB there leave c 28 MiB, so the next goes to a.
        big = first.empty(100 * MiB, np.uint8)
        big[:3].write(np.array([7, 8, 9], np.uint8))
        np.testing.assert_array_equal(big[:3].numpy(), [7, 8, 9])
        survey = by_target(daemons.survey())
        assert set(survey) == {a.address, b.address, c.address}
        assert cpu_free_memory(survey[c.address]) == 28 * MiB
        assert cpu_free_memory(survey[a.address]) == 64 * MiB
        drained = survey[b.address]
        assert isinstance(drained.error, replayd.Unavailable) and "draining" in drained.error.message
        assert drained.devices == ()

        second = daemons.session("cpu")
        assert second.target == a.address
        second.empty(MiB, np.uint8)
        survey = by_target(daemons.survey())
        assert cpu_free_memory(survey[a.address]) == 63 * MiB
        assert cpu_free_memory(survey[c.address]) == 28 * MiB
    assert on_b.closed and first.closed and second.closed  # closing the set closed its sessions


def test_daemons_that_do_not_answer_or_resolve_are_skipped(daemon):
    silent = f"127.0.0.1:{free_port()}"  # nothing listens
    with replayd.Daemons([silent, "no-such-daemon.invalid:7070", daemon.address], probe_timeout=PROBE) as daemons:
        with daemons.session("cpu") as s:
            assert s.target == daemon.address
        survey = by_target(daemons.survey())
        assert set(survey) == {silent, "no-such-daemon.invalid:7070", daemon.address}
        assert isinstance(survey[silent].error, replayd.Unavailable)
        unresolved = survey["no-such-daemon.invalid:7070"].error
        assert isinstance(unresolved, replayd.NotFound) and "no-such-daemon.invalid" in unresolved.message
        assert survey[daemon.address].ok
        assert [d.id for d in survey[daemon.address].devices] == ["cpu:0"]


def test_no_daemon_with_the_kind_is_unavailable_and_says_why(daemon):
    silent = f"127.0.0.1:{free_port()}"
    with replayd.Daemons([daemon.address, silent], probe_timeout=PROBE) as daemons:
        with pytest.raises(replayd.Unavailable) as e:
            daemons.session("cuda")
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert f"{daemon.address}: no cuda device" in e.value.message
    assert f"{silent}: UNAVAILABLE" in e.value.message


def test_no_target_that_resolves_is_not_found():
    with replayd.Daemons(["no-such-daemon.invalid:7070", "dns:///nor-this-one.invalid:7070"]) as daemons:
        with pytest.raises(replayd.NotFound, match="no daemon target resolves.*nor-this-one.invalid"):
            daemons.session("cpu")


# A daemon that refuses the session (here: the tenant's session quota there is full) is
# passed over for the next best; a client every daemon refuses sees why.
def test_a_refused_session_goes_to_the_next_best_daemon(start):
    tenants = tenant("placed", "placement-token", "trusted: true\n  quotas { sessions: 1 }")
    big, small = start(memory_limit(256), tenants=tenants), start(memory_limit(64), tenants=tenants)
    with replayd.Daemons([small.address, big.address], token="placement-token", probe_timeout=PROBE) as daemons:
        first = daemons.session("cpu")
        assert (first.target, first.tenant) == (big.address, "placed")
        second = daemons.session("cpu")
        assert second.target == small.address
        with pytest.raises(replayd.Unavailable) as e:
            daemons.session("cpu")
        for address in (big.address, small.address):
            assert f"{address}: RESOURCE_EXHAUSTED" in e.value.message
        first.close()  # the quota at big has room again
        assert daemons.session("cpu").target == big.address

    for token in ("not-a-tenant", None):
        with replayd.Daemons([small.address, big.address], token=token, probe_timeout=PROBE) as strangers:
            with pytest.raises(replayd.Unauthenticated) as e:
                strangers.session("cpu")
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert small.address in e.value.message and big.address in e.value.message


# Daemons with the same free memory take sessions in turn; a placed session computes as
# any other.
def test_ties_go_round_the_daemons_and_a_placed_session_computes(start):
    a, b = start(memory_limit(64)), start(memory_limit(64))
    with replayd.Daemons([a.address, b.address], probe_timeout=PROBE) as daemons:
        sessions = [daemons.session("cpu") for _ in range(4)]
        targets = [s.target for s in sessions]
        assert set(targets[:2]) == {a.address, b.address}
        assert targets[2:] == targets[:2], targets

        s = sessions[1]
        step = s.program(STEP, "step", "inout,int32,int32")
        x0 = np.linspace(-1, 1, 256, dtype=np.float32)
        x = s.array(x0, name="x")
        with s.capture(inputs=[x], pos=(1, 64)) as cap:
            s.launch(step, [x, 256, "pos"], pos=1)
        expected = x0 * np.float32(0.5) + np.float32(1)  # the capture's own run
        for pos in (5, 6, 7):
            expected = expected * np.float32(0.5) + np.float32(pos)
            np.testing.assert_array_equal(cap.graph.replay(pos=pos, reads=x), expected)

        assert daemons.client_of(a.address).devices()[0].id == "cpu:0"
        with pytest.raises(replayd.NotFound, match="127.0.0.1:1"):
            daemons.client_of("127.0.0.1:1")


# A name stands for its addresses, resolved at each placement: "localhost:port" is the daemon
# on 127.0.0.1; an IPv6 daemon is "[::1]:port".
def test_names_and_ipv6_addresses_resolve(start, daemon):
    v6 = start("--listen=[::1]:0")
    assert v6.address.startswith("[::1]:")
    port = port_of(daemon.address)
    local = replayd.resolve_target(f"localhost:{port}")
    assert f"127.0.0.1:{port}" in local and set(local) <= {f"127.0.0.1:{port}", f"[::1]:{port}"}
    assert replayd.resolve_target(f"dns:///localhost:{port}") == local
    assert replayd.resolve_target(v6.address) == [v6.address]
    with replayd.Daemons([f"localhost:{port}", f"dns:///localhost:{port}", v6.address], probe_timeout=PROBE) as daemons:
        survey = by_target(daemons.survey())  # each address once
        assert set(survey) == {*local, v6.address}
        assert survey[f"127.0.0.1:{port}"].ok and survey[v6.address].ok
        for _ in range(2):
            with daemons.session("cpu") as s:
                assert s.target in (f"127.0.0.1:{port}", v6.address)


def test_tls_and_the_token_apply_to_every_daemon(start, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    make_certificates(tmp_path, san="DNS:localhost")  # no IP: 127.0.0.1 alone does not verify
    tls_args = (f"--tls_cert={tmp_path / 'server.pem'}", f"--tls_key={tmp_path / 'server.key'}")
    tenants = tenant("placed", "placement-token")
    a, b = start(*tls_args, tenants=tenants), start(*tls_args, tenants=tenants)
    tls = replayd.TLS(root_ca=tmp_path / "ca.pem")
    names = [f"localhost:{port_of(a.address)}", f"localhost:{port_of(b.address)}"]
    with replayd.Daemons(names, token="placement-token", tls=tls, probe_timeout=PROBE) as daemons:
        placed = [daemons.session("cpu") for _ in range(2)]
        assert {s.target for s in placed} == {a.address, b.address}
        for s in placed:
            assert s.tenant == "placed"
            x = s.array(np.arange(4, dtype=np.float32))
            np.testing.assert_array_equal(x.numpy(), np.arange(4, dtype=np.float32))
    with replayd.Daemons([a.address], token="placement-token", tls=tls, probe_timeout=PROBE) as by_address:
        [state] = by_address.survey()
        assert isinstance(state.error, replayd.Unavailable), state  # the certificate names no address
    wrong_name = replayd.TLS(root_ca=tmp_path / "ca.pem", server_name="elsewhere.example")
    with replayd.Daemons(names[:1], token="placement-token", tls=wrong_name, probe_timeout=PROBE) as elsewhere:
        with pytest.raises(replayd.Unavailable, match=a.address):
            elsewhere.session("cpu")


def test_bad_targets_kinds_and_timeouts_are_invalid_arguments(daemon):
    for targets, why in [([], "no daemon targets"),
                         (["replayd.svc"], r'"replayd.svc": no port'),
                         (["::1:7070"], "an IPv6 address goes in brackets"),
                         (["[::1:7070"], r"no '\]' after an IPv6 address"),
                         (["host:0"], "the port is not 1 to 65535"),
                         (["host:http"], "the port is not 1 to 65535"),
                         ([":7070"], "no host"),
                         ([7070], "not a str"),
                         (None, "a list of")]:
        with pytest.raises(replayd.InvalidArgument, match=why):
            replayd.Daemons(targets)
    for timeout in (0, -1, "2", None):
        with pytest.raises(replayd.InvalidArgument, match="probe timeout"):
            replayd.Daemons(daemon.address, probe_timeout=timeout)
    with pytest.raises(replayd.InvalidArgument, match="transport"):
        replayd.Daemons(daemon.address, transport="carrier pigeon")
    with replayd.Daemons(daemon.address) as daemons:
        with pytest.raises(replayd.InvalidArgument, match=r'a kind \("cpu"\), not a device id'):
            daemons.session("cpu:0")
        with pytest.raises(replayd.InvalidArgument, match="device kind"):
            daemons.session("")
    with pytest.raises(replayd.Unavailable, match="closed"):
        daemons.session("cpu")
