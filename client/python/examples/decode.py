#!/usr/bin/env python3
"""The decode demo from Python: a small decoder-only transformer decodes tokens on the
daemon, with numpy as the host reference.

The model is the one of `replayctl demo` (client/decode_model.h): 2 layers, width 256, 4
heads, vocabulary 512, context 256, deterministic pseudo-random weights in constant
buffers and a KV cache in session buffers. Its kernels are the cpu-c ones of
client/kernels/decode.c, launched with the geometry of client/decode_geometry.h. One
decode step (24 calls) is captured once with the variable `pos`; its last kernel writes
the argmax token into the buffer the next step embeds, so no step needs the client.
Tokens are then generated three ways: one replay round trip per token, all replays
pipelined on the session stream, and one replay sequence streaming each step's logits
back. Every step's logits in every mode are checked against numpy to 1e-4.

    PYTHONPATH=build/client/python python3 client/python/examples/decode.py [--target 127.0.0.1:7070]
    python3 -m replayd demo             (the same, as installed with the package)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, TextIO

import numpy as np

import replayd

LAYERS, D, HEADS, VOCAB, CTX, FF = 2, 256, 4, 512, 256, 1024
MATVEC_CHUNK = 64  # columns one matvec invocation computes (decode.c's accumulator holds 256)
TOLERANCE = 1e-4
BOS = 1

# entry: (signature, whether the kernel takes its invocation index as a trailing int)
KERNELS = {
    "embed": ("out,in,in,in,int32,int32", False),
    "argmax": ("out,in,int32", False),
    "rmsnorm": ("out,in,in,int32", False),
    "matvec": ("inout,in,in,int32,int32,int32,int32", True),
    "kv_store": ("inout,inout,in,int32,int32", False),
    "attn_scores": ("out,in,in,int32,int32,int32,int32", True),
    "attn_softmax": ("inout,int32,int32", True),
    "attn_mix": ("out,in,in,int32,int32,int32,int32", True),
}


def kernel_source(path: Optional[str] = None) -> str:
    """decode.c: `path`, else the source tree's client/kernels/decode.c, else the copy
    the package ships (replayd/kernels/decode.c)."""
    here = Path(__file__).resolve().parent
    candidates = [Path(path)] if path else [here.parents[1] / "kernels" / "decode.c",
                                            here / "kernels" / "decode.c"]
    for c in candidates:
        if c.is_file():
            return c.read_text()
    raise FileNotFoundError(f"decode.c not found (looked in {', '.join(map(str, candidates))}); give --kernels")


def pseudo_random(n: int, seed: int, scale: float) -> np.ndarray:
    """The weights of client/decode_model.cc: a 32-bit LCG, x -> x * 1664525 + 1013904223,
    from seed * 2654435761 + 1; each value ((x >> 8) & 0xffff) / 65536 - 0.5, times 2 * scale,
    in float32. The n states at once: x_k = a^k x_0 + c (1 + a + ... + a^(k-1)) mod 2^32."""
    a, c = np.uint32(1664525), np.uint32(1013904223)
    x0 = np.uint32((seed * 2654435761 + 1) & 0xFFFFFFFF)
    powers = np.cumprod(np.full(n, a, np.uint32), dtype=np.uint32)  # a^1 .. a^n
    sums = np.cumsum(np.concatenate(([np.uint32(1)], powers[:-1])), dtype=np.uint32)  # 1 + .. + a^(k-1)
    x = powers * x0 + c * sums
    v = ((x >> np.uint32(8)) & np.uint32(0xFFFF)).astype(np.float32)
    return (v / np.float32(65536.0) - np.float32(0.5)) * np.float32(2.0) * np.float32(scale)


class Weights:
    """float32 weights; matrices row-major [rows][cols], applied as out[j] = sum_i x[i] w[i][j]."""

    def __init__(self) -> None:
        seed = iter(range(1, 100))
        row = 1.0 / np.sqrt(np.float32(D))
        self.tok_emb = pseudo_random(VOCAB * D, next(seed), 1.0).reshape(VOCAB, D)
        self.pos_emb = pseudo_random(CTX * D, next(seed), 0.1).reshape(CTX, D)
        self.lnf = np.ones(D, np.float32)
        self.wout = pseudo_random(D * VOCAB, next(seed), row).reshape(D, VOCAB)
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append({
                "ln1": np.ones(D, np.float32),
                "wqkv": pseudo_random(D * 3 * D, next(seed), row).reshape(D, 3 * D),
                "wo": pseudo_random(D * D, next(seed), row).reshape(D, D),
                "ln2": np.ones(D, np.float32),
                "w1": pseudo_random(D * FF, next(seed), row).reshape(D, FF),
                "w2": pseudo_random(FF * D, next(seed), 1.0 / np.sqrt(np.float32(FF))).reshape(FF, D),
            })


def rmsnorm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    inv = np.float32(1.0) / np.sqrt(np.dot(x, x) / np.float32(D) + np.float32(1e-5))
    return x * inv * g


class HostModel:
    """The reference: one decode step's logits with numpy, keeping its own KV cache."""

    def __init__(self, w: Weights) -> None:
        self.w = w
        self.k = np.zeros((LAYERS, CTX, D), np.float32)
        self.v = np.zeros((LAYERS, CTX, D), np.float32)

    def step(self, pos: int, tok: int) -> np.ndarray:
        w, hd = self.w, D // HEADS
        x = w.tok_emb[tok] + w.pos_emb[pos - 1]
        for l, L in enumerate(w.layers):
            qkv = rmsnorm(x, L["ln1"]) @ L["wqkv"]
            self.k[l, pos - 1], self.v[l, pos - 1] = qkv[D:2 * D], qkv[2 * D:]
            q = qkv[:D].reshape(HEADS, hd)
            keys = self.k[l, :pos].reshape(pos, HEADS, hd)
            scores = np.einsum("hi,thi->ht", q, keys) / np.sqrt(np.float32(hd))
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att = np.einsum("ht,thi->hi", p, self.v[l, :pos].reshape(pos, HEADS, hd)).reshape(D)
            x = x + att @ L["wo"]
            x = x + np.maximum(rmsnorm(x, L["ln2"]) @ L["w1"], np.float32(0)) @ L["w2"]
        return rmsnorm(x, w.lnf) @ w.wout


class DeviceModel:
    """The model on the daemon: programs, weights in constant buffers, the KV cache."""

    def __init__(self, s: replayd.Session, w: Weights, source: str) -> None:
        self.s = s
        self.programs: Dict[str, replayd.Program] = {
            entry: s.program(source, entry, signature, format="cpu-c", options=["-O2"], core_id=core)
            for entry, (signature, core) in KERNELS.items()}
        self.tok_emb, self.pos_emb = s.array(w.tok_emb), s.array(w.pos_emb)
        self.lnf, self.wout = s.array(w.lnf), s.array(w.wout)
        self.layers = [{k: s.array(v) for k, v in L.items()} for L in w.layers]
        self.kv = [(s.empty((CTX, D)), s.empty((CTX, D))) for _ in range(LAYERS)]
        self.weight_bytes = sum(b.nbytes for b in [self.tok_emb, self.pos_emb, self.lnf, self.wout] +
                                [b for L in self.layers for b in L.values()])

    def step(self, cap: replayd.Capture, tok: replayd.Buffer, logits: replayd.Buffer, pos: int) -> None:
        """Launches one decode step (the geometry of client/decode_geometry.h, cpu-c set):
        the embedding of tok[0] at pos, 10 calls per layer, the final norm, the logits and
        the argmax written back into tok. The step's temporaries are the capture's scratch
        buffers, so that they become internals of the graph, placed by its memory plan."""
        s, p = self.s, self.programs

        def launch(entry: str, args: list, global_: object = 1) -> None:
            s.launch(p[entry], args, global_, pos=pos)

        def matvec(out: replayd.View, x: replayd.View, w: replayd.View, rows: int, cols: int, mode: int) -> None:
            launch("matvec", [out, x, w, rows, cols, MATVEC_CHUNK, mode], -(-cols // MATVEC_CHUNK))

        x = cap.scratch(D)
        launch("embed", [x, self.tok_emb, self.pos_emb, tok, "pos", D])
        for L, (k, v) in zip(self.layers, self.kv):
            h, qkv, scores = cap.scratch(D), cap.scratch(3 * D), cap.scratch((HEADS, CTX))
            att, ff = cap.scratch(D), cap.scratch(FF)
            launch("rmsnorm", [h, x, L["ln1"], D])
            matvec(qkv, h, L["wqkv"], D, 3 * D, 0)
            launch("kv_store", [k, v, qkv, "pos", D])
            launch("attn_scores", [scores, qkv, k, "pos", D, HEADS, CTX], ("pos", HEADS))
            launch("attn_softmax", [scores, "pos", CTX], HEADS)
            launch("attn_mix", [att, scores, v, "pos", D, HEADS, CTX], HEADS)
            matvec(x, att, L["wo"], D, D, 1)
            launch("rmsnorm", [h, x, L["ln2"], D])
            matvec(ff, h, L["w1"], D, FF, 2)
            matvec(x, ff, L["w2"], FF, D, 1)
        h = cap.scratch(D)
        launch("rmsnorm", [h, x, self.lnf, D])
        matvec(logits, h, self.wout, D, VOCAB, 0)
        launch("argmax", [tok, logits, VOCAB])


class Checker:
    """Checks each step's logits against the reference, following the tokens the device
    picks (the first mode generates them; the others must pick the same)."""

    def __init__(self, w: Weights) -> None:
        self.host = HostModel(w)
        self.expected: List[np.ndarray] = []
        self.tokens = [BOS]
        self.max_error = 0.0

    def __call__(self, step: int, logits: np.ndarray, tok: np.ndarray) -> None:
        if step == len(self.expected):
            self.expected.append(self.host.step(step + 1, self.tokens[step]))
            self.tokens.append(int(tok[0]))
        elif int(tok[0]) != self.tokens[step + 1]:
            self.max_error = float("inf")  # another token than the first generation chose
        self.max_error = max(self.max_error, float(np.abs(logits - self.expected[step]).max()))


def run(client: replayd.Client, device: str = "cpu:0", tokens: int = 128, kernels: Optional[str] = None,
        out: TextIO = sys.stdout) -> float:
    """Runs the demo and prints its report; returns the largest logit error against numpy.
    Raises replayd.FailedPrecondition when it passes the tolerance."""
    if not 1 <= tokens <= CTX:
        raise replayd.InvalidArgument(f"tokens must be in [1, {CTX}], not {tokens}")
    source = kernel_source(kernels)
    w = Weights()
    with client.session(device) as s:
        if "cpu-c" not in s.device.formats:
            raise replayd.FailedPrecondition(f"{device} does not take cpu-c kernels; this demo runs "
                                             "decode.c (replayctl demo runs decode.cu on GPUs)")
        start = time.perf_counter()
        model = DeviceModel(s, w, source)
        load_seconds = time.perf_counter() - start
        hits = sum(p.cache_hit for p in model.programs.values())
        logits, tok = s.empty(VOCAB, name="logits"), s.empty(1, np.int32, name="tok")

        def reset() -> None:
            tok.write(np.array([BOS], np.int32))

        # Capture one step with the variable pos (it runs, too: pos 1, the first token).
        reset()
        with s.capture(inputs=[tok], outputs=[logits], pos=(1, CTX)) as cap:
            model.step(cap, tok, logits, 1)
        g = cap.graph
        check = Checker(w)
        reads = [logits, tok]

        # 1. One replay per token, each a round trip on the session stream.
        reset()
        latencies = []
        t0 = time.perf_counter()
        for step in range(tokens):
            t = time.perf_counter()
            got = g.replay(pos=step + 1, reads=reads)
            latencies.append(time.perf_counter() - t)
            check(step, *got)
        per_token = time.perf_counter() - t0

        # 2. Pipelined: every replay sent before any reply is read.
        reset()
        t0 = time.perf_counter()
        futures = [g.replay_async(pos=step + 1, reads=reads) for step in range(tokens)]
        for step, f in enumerate(futures):
            check(step, *f.result())
        pipelined = time.perf_counter() - t0

        # 3. One replay sequence: pos steps from 1, each replay's reads streamed back.
        reset()
        t0 = time.perf_counter()
        for step, got in enumerate(g.sequence(pos=range(1, tokens + 1), reads=reads)):
            check(step, *got)
        sequence = time.perf_counter() - t0

        info = g.info()
        ms = np.array(latencies) * 1e3
        print(f"replayd decode demo from Python on {device}: {LAYERS} layers, width {D}, {HEADS} heads, "
              f"vocabulary {VOCAB}, context {CTX}", file=out)
        print(f"programs: {len(model.programs)} loaded, {hits} from the compile cache, {load_seconds:.2f} s "
              f"loading; weights {model.weight_bytes / 2**20:.1f} MiB in constant buffers", file=out)
        print(f"graph {g.key[:16]}: {g.calls} calls, {g.batches} batch(es) per step, arena {g.arena_bytes} bytes, "
              f"plan saved {g.plan_saved_bytes} bytes", file=out)
        print("tokens: " + " ".join(map(str, check.tokens[1:17])) + (" ..." if tokens > 16 else ""), file=out)
        print(f"{'':34} {'p50 ms':>9} {'p99 ms':>9} {'tokens/s':>10}", file=out)
        print(f"{'replay, one round trip per token':34} {np.percentile(ms, 50):9.3f} {np.percentile(ms, 99):9.3f} "
              f"{tokens / per_token:10.1f}", file=out)
        print(f"{'replay, pipelined':34} {'-':>9} {'-':>9} {tokens / pipelined:10.1f}", file=out)
        print(f"{'replay sequence, one request':34} {'-':>9} {'-':>9} {tokens / sequence:10.1f}", file=out)
        print(f"replays {info.replays}; the capture was {'found in' if g.cache_hit else 'added to'} the "
              "tenant's graph cache", file=out)
        ok = check.max_error <= TOLERANCE
        print(f"logits against numpy at every step of every mode: max |error| {check.max_error:.3g} "
              f"(tolerance {TOLERANCE:.0e}): {'OK' if ok else 'FAILED'}", file=out)
        if not ok:
            raise replayd.FailedPrecondition(f"decode logits off the numpy reference by {check.max_error}")
        return check.max_error


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:7070", help="the daemon's address")
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated in each mode")
    ap.add_argument("--token", default=None, help="bearer token (default $REPLAYD_TOKEN)")
    ap.add_argument("--kernels", default=None, help="decode.c (default: client/kernels/decode.c)")
    args = ap.parse_args(argv)
    try:
        with replayd.connect(args.target, token=args.token) as client:
            run(client, args.device, args.tokens, args.kernels)
    except replayd.Error as e:
        print(f"decode: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
