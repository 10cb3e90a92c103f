"""TLS and mutual TLS to the daemon, and the command line (python3 -m replayd, the decode
example)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import replayd
from conftest import ROOT, STEP, Daemon, make_certificates, require_transport


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    d = tmp_path_factory.mktemp("tls")
    make_certificates(d)
    return d


@pytest.mark.parametrize("transport", ["native", "direct"])
@pytest.mark.parametrize("mutual", [False, True])
def test_tls_and_mutual_tls(certificates, mutual, transport):
    require_transport(transport)
    c = certificates
    args = [f"--tls_cert={c / 'server.pem'}", f"--tls_key={c / 'server.key'}"]
    if mutual:
        args.append(f"--tls_client_ca={c / 'ca.pem'}")
    d = Daemon(args)
    try:
        tls = replayd.TLS(root_ca=c / "ca.pem", cert=c / "client.pem", key=(c / "client.key").read_bytes())
        with replayd.connect(d.address, tls=tls, transport=transport) as client, client.session("cpu:0") as s:
            step = s.program(STEP, "step", "inout,int32,int32")
            x = s.array(np.ones(4, np.float32), name="x")
            with s.capture(inputs=[x], pos=(1, 4)) as cap:
                s.launch(step, [x, 4, "pos"], pos=1)
            np.testing.assert_array_equal(cap.graph.replay(pos=2, reads=x), np.full(4, 2.75, np.float32))
        with replayd.connect(d.address) as plain:  # no TLS: the handshake fails
            with pytest.raises(replayd.Unavailable):
                plain.devices()
        if mutual:  # TLS without a client certificate
            with replayd.connect(d.address, tls=replayd.TLS(root_ca=c / "ca.pem")) as anonymous:
                with pytest.raises(replayd.Unavailable):
                    anonymous.devices()
    finally:
        d.stop()


def run_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_module_lists_devices(daemon):
    r = run_python("-m", "replayd", "--target", daemon.address, "devices")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cpu:0") and "formats cpu-c" in r.stdout


def test_module_says_why_it_failed(daemon):
    r = run_python("-m", "replayd", "--target", daemon.address, "demo", "--device", "cpu:5", "--tokens", "2")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr


def test_decode_demo_matches_numpy(daemon):
    # The example as shipped in the package, and from the source tree with its kernels there.
    for argv in (["-m", "replayd", "--target", daemon.address, "demo", "--tokens", "12"],
                 [str(ROOT / "client/python/examples/decode.py"), "--target", daemon.address, "--tokens", "6"]):
        r = run_python(*argv)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "tokens: 358 63 349" in r.stdout  # the tokens replayctl demo prints
        assert "replay sequence, one request" in r.stdout
        assert r.stdout.rstrip().endswith("OK"), r.stdout
