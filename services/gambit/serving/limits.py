"""Message and size limits of the Scorer path, in one place (no torch, no grpc: the config builders read
them). The client, the server, the Ray deployment, the payload checks and the message-size arithmetic
of ``ops.serve_env`` all read these, so a limit raised on one side is raised on every side.
"""

from __future__ import annotations

# longest trace id (UTF-8 bytes) a Scorer keeps: a Target sends "run:node", a run id is at most 64
# characters (``solve_config.RUN_ID``) and a node id a decimal int, so 85 bytes at most
MAX_TRACE_ID_BYTES = 128
# forks + drops a Target keeps for the next call while its Scorer is down (the oldest go first beyond it:
# a Scorer down that long keeps some dropped histories, instead of the client growing without end); a
# Scorer takes twice that in one call (``scorer_core.max_edits``), so the queue is never refused for good
MAX_PENDING = 65536
# trace histories / MiB of them a sequence scorer keeps (least recently used forgotten beyond):
# ``gambit.scoring.scorer``'s defaults (tested equal), here without importing torch
MAX_KEYS = 65_536
MAX_STATE_MB = 512
MAX_ROWS = 4096  # state rows one Score call may carry by default (more: INVALID_ARGUMENT)
# a longer batch wait delays every call by it; a Target's call times out after 2 s (RemoteScorer.timeout_s)
MAX_BATCH_WAIT_MS = 1000.0

# gRPC message caps of Serve's proxy and its hop to a replica (``ops.serve_env.SERVE_ENV``; why 128 MiB:
# there); the Scorer's own endpoints (each replica's direct one, `gambit scorer serve`) take, and a
# Target's client sends, messages up to SCORER_ENDPOINT_MESSAGE_BYTES: raising the proxy's past it gains
# nothing
GRPC_MAX_MESSAGE_BYTES = 128 << 20
SCORER_ENDPOINT_MESSAGE_BYTES = 256 << 20
STATE_VALUE_BYTES = 4  # float32 states, the widest a Target sends (``payload.encode_states``)
# per row beside its states: a trace id of at most MAX_TRACE_ID_BYTES and two confidence floats, with
# their framing
ROW_EXTRA_BYTES = 140
# the forks and drops one call may carry: 2 x MAX_PENDING, each a Fork of two ids at most (an id with its
# 2 bytes of framing, 2 more for the Fork's): a Target's queue while its Scorer was down
EDIT_BYTES = 2 * MAX_PENDING * (2 * (MAX_TRACE_ID_BYTES + 2) + 2)
