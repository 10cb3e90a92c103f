"""replayd: a Python client of the replayd daemon, which runs kernels on remote devices.

    import numpy as np
    import replayd

    client = replayd.connect("127.0.0.1:7070")
    with client.session("cpu:0") as s:
        x = s.array(np.arange(1024, dtype=np.float32), name="x")
        step = s.program(SOURCE, "step", signature="inout,int32,int32")
        with s.capture(inputs=[x], pos=(1, 1 << 20)) as cap:
            s.launch(step, [x, 1024, "pos"], pos=1)
        g = cap.graph
        after = g.replay(pos=17, reads=x)          # a numpy array

Sessions, buffers and views are in `replayd.session`, captures and graphs in
`replayd.graph`, sessions placed across many daemons (`Daemons`) in `replayd.placement`,
errors in `replayd.errors`; see docs/python.md.
"""

from .client import TLS, Client, Device, LaunchLimits, connect
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                     FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable, Unimplemented,
                     Unknown)
from .graph import Capture, Graph, GraphParam, ReplaySequence
from .placement import PROBE_TIMEOUT, Daemons, DaemonState, resolve_target
from .session import Buffer, Future, Program, Session, Variable, View, parse_signature

__all__ = [
    "connect", "Client", "Device", "LaunchLimits", "TLS",
    "Session", "Buffer", "View", "Program", "Variable", "Future", "parse_signature",
    "Capture", "Graph", "GraphParam", "ReplaySequence",
    "Daemons", "DaemonState", "PROBE_TIMEOUT", "resolve_target",
    "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied",
    "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
]
