#!/usr/bin/env python3
"""The Python client against the C++ client, in one run, on one daemon.

The chain of tests/bench (32 calls of `step` over 1024 floats with the variable pos) is
captured and timed as tests/bench/stream_bench.cc times it: the median round trip of a
replay with a 4 KiB read (wait=True) over the Session stream, and replays/s with
--iterations replays queued before any reply is read. The daemon (this build's, started
here with stream_bench's defaults: --stream_window=8 --stream_threads=1) and each client
run as separate processes over loopback; with --placement=split the clients are pinned to
core 0 and the daemon to core 1, as the C++ benchmarks place them. Each run times the C++
client (chain_reference.cc beside this file) and the Python client over each transport
(native, grpcio's direct and threaded), each in a process of its own, interleaved; medians
over --runs.

    cmake --build build --target replayd replayd_python replayd_chain_reference
    PYTHONPATH=build/client/python python3 tests/python/bench_client.py [--runs 7] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple


import replayd
import replayd.stream

ROOT = Path(__file__).resolve().parents[2]
CALLS, FLOATS = 32, 1024  # kChainCalls, kChainFloats of tests/bench/bench_support.h
STEP = r"""
void step(float *x, int n, int pos) {
  for (int i = 0; i < n; ++i) x[i] = x[i] * 0.5f + (float)pos;
}"""


def pin(cpu: Optional[int]) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


class Daemon:
    def __init__(self, binary: Path, cpu: Optional[int]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="replayd-pybench-"))
        self.log = self.dir / "log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(binary), "--listen=127.0.0.1:0", f"--cache_dir={self.dir / 'cache'}", "--devices=cpu", "--isolation=shared",
                 "--stream_window=8", "--stream_threads=1"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: pin(cpu))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on (\S+)", self.log.read_text(errors="replace"))
            if m:
                self.address = m.group(1)
                return
            time.sleep(0.02)
        self.stop()
        raise SystemExit(f"the daemon did not start:\n{self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def python_run(address: str, transport: str, n: int, cpu: Optional[int]) -> Tuple[float, float]:
    """One run of the Python client in a process of its own (as the C++ client's): the
    chain captured in a session, then timed. A process keeps the transports apart: an
    idle threaded stream's polling thread slows every other call of its process."""
    argv = [sys.executable, __file__, "--child", transport, "--target", address, "--iterations", str(n)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: pin(cpu)).stdout
    m = re.search(r"round_trip_us (\S+) pipelined_per_s (\S+)", out)
    if not m:
        raise SystemExit(f"unexpected output of the {transport} child: {out!r}")
    return float(m.group(1)), float(m.group(2))


def child(address: str, transport: str, n: int) -> None:
    """Prints "round_trip_us R pipelined_per_s P" as chain_reference does."""
    with replayd.connect(address, window=256, transport=transport) as client, client.session("cpu:0") as s:
        step = s.program(STEP, "step", "inout,int32,int32")
        x = s.empty(FLOATS, name="x")
        with s.capture(inputs=[x], pos=(1, 1 << 30)) as cap:
            for _ in range(CALLS):
                s.launch(step, [x, FLOATS, "pos"], pos=1)
        g = cap.graph
        for _ in range(100):  # warm up
            g.replay(pos=3, wait=True, reads=x)
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            r = g.replay(pos=3, wait=True, reads=x)
            samples.append(time.perf_counter() - t)
            assert r.nbytes == 4096
        start = time.perf_counter()
        futures = [g.replay_async(pos=1 + i) for i in range(n)]
        for f in futures:
            f.result()
        rate = n / (time.perf_counter() - start)
    print(f"round_trip_us {statistics.median(samples) * 1e6:.2f} pipelined_per_s {rate:.0f}")


def cpp_run(reference: Path, address: str, n: int, cpu: Optional[int]) -> Tuple[float, float]:
    argv = [str(reference), f"--target={address}", f"--iterations={n}", "--window=256"]
    if cpu is not None:
        argv.append(f"--cpu={cpu}")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    m = re.search(r"round_trip_us (\S+) pipelined_per_s (\S+)", out)
    if not m:
        raise SystemExit(f"unexpected output of {reference}: {out!r}")
    return float(m.group(1)), float(m.group(2))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="interleaved runs; medians are reported")
    ap.add_argument("--iterations", type=int, default=2000, help="round trips, and replays queued, per run")
    ap.add_argument("--placement", choices=["split", "any"], default="split",
                    help="split: clients on core 0, the daemon on core 1; any: left to the scheduler")
    ap.add_argument("--build", default=str(ROOT / "build"), help="the build directory")
    ap.add_argument("--child", choices=["native", "direct", "threaded"], help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.target, args.child, args.iterations)
        return 0
    build = Path(args.build)
    binary, reference = build / "server" / "replayd", build / "tests" / "python" / "replayd_chain_reference"
    for p in (binary, reference):
        if not p.is_file():
            raise SystemExit(f"{p} is missing: cmake --build {build} --target replayd replayd_chain_reference")
    split = args.placement == "split" and (os.cpu_count() or 1) >= 2
    client_cpu, daemon_cpu = (0, 1) if split else (None, None)

    daemon = Daemon(binary, daemon_cpu)
    try:
        subjects: Dict[str, Callable[[], Tuple[float, float]]] = {
            "C++ client (client/client.h)": lambda: cpp_run(reference, daemon.address, args.iterations, client_cpu),
            "Python client, direct transport":
                lambda: python_run(daemon.address, "direct", args.iterations, client_cpu),
            "Python client, threaded transport":
                lambda: python_run(daemon.address, "threaded", args.iterations, client_cpu),
        }
        if replayd.stream.native_available():
            subjects["Python client, native transport"] = (
                lambda: python_run(daemon.address, "native", args.iterations, client_cpu))
        results: Dict[str, List[Tuple[float, float]]] = {name: [] for name in subjects}
        for _ in range(args.runs):
            for name, run in subjects.items():
                results[name].append(run())
    finally:
        daemon.stop()

    medians = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for name, rs in results.items()}
    base_rt, base_rate = medians["C++ client (client/client.h)"]
    print(f"replayd Python client benchmark: a {CALLS}-kernel chain over {FLOATS} floats with variable pos, "
          f"on cpu:0")
    print("each client and the daemon as separate processes on loopback; placement: "
          + ("clients pinned to core 0, daemon to core 1" if split else "left to the scheduler"))
    print(f"{args.runs} interleaved runs, medians; {args.iterations} round trips and {args.iterations} pipelined "
          "replays per run; daemon --stream_window=8 --stream_threads=1; client window 256\n")
    print(f"{'client':36} {'replay + 4 KiB read':>20} {'ratio':>7} {'pipelined':>12} {'ratio':>7}")
    for name, (rt, rate) in medians.items():
        print(f"{name:36} {rt:17.1f} us {rt / base_rt:6.2f}x {rate:10.0f}/s {rate / base_rate:6.2f}x")
    best = "Python client, native transport" if replayd.stream.native_available() else "Python client, direct transport"
    print(f"\ntarget: the Python round trip ({best.split(', ')[1]}) at most 1.5x the C++ client's: "
          + ("met" if medians[best][0] <= 1.5 * base_rt else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
