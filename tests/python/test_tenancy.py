"""Authentication and tenant policy through the Python client: a daemon with a tenants
file wants a token on every call, the session stream's included."""

from __future__ import annotations

import numpy as np
import pytest

import replayd
from conftest import STEP, TRANSPORTS, Daemon, require_transport, tenant

TENANTS = (tenant("alice", "alice-token", "trusted: true\n  quotas { memory_bytes: 8388608 }")
           + tenant("bob", "bob-token", 'trusted: false\n  formats: "cuda-c"')
           + tenant("carol", "carol-token", 'trusted: true\n  devices: "cuda:0"'))


@pytest.fixture(scope="module")
def tenant_daemon():
    d = Daemon(tenants=TENANTS)
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv("REPLAYD_TOKEN", raising=False)


def test_a_missing_or_unknown_token_is_unauthenticated(tenant_daemon):
    with replayd.connect(tenant_daemon.address) as c:
        with pytest.raises(replayd.Unauthenticated) as e:
            c.devices()
        assert e.value.code.name == "UNAUTHENTICATED" and e.value.message
        with pytest.raises(replayd.Unauthenticated):
            c.session("cpu:0")
    with replayd.connect(tenant_daemon.address, token="mallory") as c:
        with pytest.raises(replayd.Unauthenticated):
            c.session("cpu:0")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_tenant_with_its_token_captures_and_replays(tenant_daemon, transport):
    require_transport(transport)
    with replayd.connect(tenant_daemon.address, token="alice-token", transport=transport) as c:
        assert any(d.id == "cpu:0" for d in c.devices())
        with c.session("cpu:0") as s:
            assert s.tenant == "alice"
            step = s.program(STEP, "step", "inout,int32,int32")
            x = s.array(np.zeros(4, np.float32), name="x")
            with s.capture(inputs=[x], pos=(1, 8)) as cap:
                s.launch(step, [x, 4, "pos"], pos=1)
            got = cap.graph.replay(pos=2, reads=x)  # on the session stream, with the token
            np.testing.assert_array_equal(got, np.full(4, 2.5, np.float32))
            assert [r[0] for r in cap.graph.sequence(pos=range(1, 3), reads=x)] == [2.25, 3.125]


def test_the_token_comes_from_the_environment(tenant_daemon, monkeypatch):
    monkeypatch.setenv("REPLAYD_TOKEN", "alice-token")
    with replayd.connect(tenant_daemon.address) as c:
        with c.session("cpu:0") as s:
            assert s.tenant == "alice"


def test_the_tenants_policy_is_permission_denied_and_its_quota_resource_exhausted(tenant_daemon):
    with replayd.connect(tenant_daemon.address, token="bob-token") as c:
        with c.session("cpu:0") as s:
            with pytest.raises(replayd.PermissionDenied, match="format cpu-c"):
                s.program(STEP, "step", "inout,int32,int32")
    with replayd.connect(tenant_daemon.address, token="carol-token") as c:
        with pytest.raises(replayd.PermissionDenied):
            c.session("cpu:0")
    with replayd.connect(tenant_daemon.address, token="alice-token") as c:
        with c.session("cpu:0") as s:
            held = s.empty(1 << 20, np.float32)  # 4 of its 8 MiB
            with pytest.raises(replayd.ResourceExhausted, match="memory"):
                s.empty(1 << 21, np.float32)
            more = s.empty(1 << 19, np.float32)  # the failure reserved nothing
            assert held.nbytes + more.nbytes == 6 << 20
