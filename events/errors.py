"""What the NATS adapters of the ports raise when NATS itself fails, by names a caller may
catch without importing the NATS client (only ``events/``, the bridge and the host's
connection code import it: ``tests/unit/test_architecture.py``).

These are the NATS client's own classes under kernelflow's names, so that catching one
catches exactly what catching the client's class did. The memory adapters never raise
them: nothing there is a network.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

# Any failure of NATS or of a JetStream request (the client's base class): a server
# restarting, a request that timed out, a connection closed under a call...
TransportError = nats.errors.Error
# A request NATS did not answer in time (a TimeoutError too).
RequestTimeout = nats.errors.TimeoutError
# The connection was closed (by ``stop``, or given up on) while a call used it.
ConnectionClosed = nats.errors.ConnectionClosedError
# JetStream is not enabled on the server, or not available to this account.
JetStreamUnavailable = nats.js.errors.ServiceUnavailableError

__all__ = ["ConnectionClosed", "JetStreamUnavailable", "RequestTimeout", "TransportError"]
