"""python3 -m replayd: the command line of the Python client.

    python3 -m replayd [--target HOST:PORT] [--token TOKEN] [--tls-ca PEM] devices
    python3 -m replayd [--target HOST:PORT] demo [--device cpu:0] [--tokens 128]

`devices` lists what the daemon serves; `demo` runs the decode demo
(client/python/examples/decode.py) and checks it against numpy.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import errors
from .client import TLS, Client, connect


def devices(client: Client) -> None:
    for d in client.devices():
        lim = d.limits
        print(f"{d.id:<8} {d.kind:<5} {d.name} ({d.architecture})\n"
              f"  memory {d.total_memory >> 20} MiB total, {d.free_memory >> 20} MiB free; "
              f"formats {','.join(d.formats)}; max global {lim.max_global_total}; {d.driver_version}")


def demo(client: Client, device: str, tokens: int, kernels: Optional[str]) -> None:
    from . import decode_demo  # the build's copy of client/python/examples/decode.py
    decode_demo.run(client, device, tokens, kernels)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m replayd", description="The replayd Python client.")
    ap.add_argument("--target", default="127.0.0.1:7070", help="the daemon's address (default %(default)s)")
    ap.add_argument("--token", default=None, help="bearer token for a daemon with tenants (default $REPLAYD_TOKEN)")
    ap.add_argument("--tls-ca", default=None, help="PEM file of the CA that signed the daemon's certificate: use TLS")
    ap.add_argument("--tls-cert", default=None, help="PEM certificate chain of this client (mutual TLS)")
    ap.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", help="the devices the daemon serves")
    d = sub.add_parser("demo", help="the decode demo, checked against numpy")
    d.add_argument("--device", default="cpu:0")
    d.add_argument("--tokens", type=int, default=128, help="tokens generated in each mode (default %(default)s)")
    d.add_argument("--kernels", default=None, help="decode.c to load (default: the package's copy)")
    args = ap.parse_args(argv)
    tls = TLS(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None
    try:
        with connect(args.target, token=args.token, tls=tls) as client:
            if args.command == "devices":
                devices(client)
            else:
                demo(client, args.device, args.tokens, args.kernels)
    except errors.Error as e:
        print(f"replayd: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
