"""Fixtures of the Python client's tests: a real daemon of this build on an ephemeral
loopback port (its own compile cache and, where asked, a tenants file), stopped and cleaned
up at the end; clients of it over both stream transports; sessions; certificates for TLS.

The daemon is $REPLAYD_BINARY (ctest sets it), else build/server/replayd.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import replayd
import replayd.stream

ROOT = Path(__file__).resolve().parents[2]

# out = a * k + b over n floats, one invocation per `chunk` elements (core_id).
SAXPY = r"""
void saxpy(float *out, const float *a, const float *b, int n, int k, int chunk, int core) {
  int lo = core * chunk, hi = lo + chunk < n ? lo + chunk : n;
  for (int i = lo; i < hi; ++i) out[i] = a[i] * (float)k + b[i];
}
"""

# The chain kernel of tests/bench: x = x * 0.5 + pos over n floats.
STEP = r"""
void step(float *x, int n, int pos) {
  for (int i = 0; i < n; ++i) x[i] = x[i] * 0.5f + (float)pos;
}
"""


def daemon_binary() -> Path:
    path = Path(os.environ.get("REPLAYD_BINARY") or ROOT / "build" / "server" / "replayd")
    if not path.is_file():
        pytest.exit(f"no daemon binary at {path}: build it (cmake --build build --target replayd) "
                    "or set REPLAYD_BINARY", returncode=2)
    return path


class Daemon:
    """A replayd process on 127.0.0.1:<ephemeral port>, its address read from its log."""

    def __init__(self, args: List[str] = (), tenants: Optional[str] = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="replayd-pytest-"))
        self.log_path = self.dir / "daemon.log"
        argv = [str(daemon_binary()), "--listen=127.0.0.1:0", f"--cache_dir={self.dir / 'cache'}",
                "--devices=cpu", "--log_level=info", *args]
        if tenants is not None:
            (self.dir / "tenants.textproto").write_text(tenants)
            argv.append(f"--tenants={self.dir / 'tenants.textproto'}")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.address = self._wait_for_address()

    def _wait_for_address(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on (\S+)", self.log())
            if m:
                return m.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the daemon did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def tenant(name: str, token: str, extra: str = "trusted: true") -> str:
    """A tenants-file entry, with the SHA-256 of the token as operators write it."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f'tenant {{\n  name: "{name}"\n  token_sha256: "{digest}"\n  {extra}\n}}\n'


def make_certificates(d: Path, san: str = "DNS:localhost,IP:127.0.0.1") -> None:
    """A CA, a daemon's certificate for the names `san`, a client's certificate."""
    key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    (d / "san.ext").write_text(f"subjectAltName={san}\n")
    script = " && ".join([
        f"openssl req -x509 {key} -keyout ca.key -out ca.pem -days 2 -subj /CN=replayd-test-ca",
        f"openssl req {key} -keyout server.key -out server.csr -subj /CN=localhost",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile san.ext",
        f"openssl req {key} -keyout client.key -out client.csr -subj /CN=client",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2",
    ])
    subprocess.run(script, shell=True, cwd=d, check=True, capture_output=True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = Daemon(["--cpu_memory_limit=1073741824", "--cpu_threads=2"])
    yield d
    d.stop()


TRANSPORTS = ["native", "direct", "threaded"]


def require_transport(transport: str) -> None:
    """Skips a test of the native transport where the package was built without it (no
    Python headers); a build with them always has it."""
    if transport == "native" and not replayd.stream.native_available():
        pytest.skip("the native transport (replayd._transport) was not built: no Python headers (python3-dev)")


@pytest.fixture(scope="session", params=TRANSPORTS)
def any_client(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[replayd.Client]:
    """A client over each stream transport."""
    require_transport(request.param)
    with replayd.connect(daemon.address, transport=request.param) as c:
        yield c


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> Iterator[replayd.Client]:
    with replayd.connect(daemon.address) as c:
        yield c


@pytest.fixture
def session(client: replayd.Client) -> Iterator[replayd.Session]:
    with client.session("cpu:0") as s:
        yield s


@pytest.fixture
def any_session(any_client: replayd.Client) -> Iterator[replayd.Session]:
    with any_client.session("cpu:0") as s:
        yield s
