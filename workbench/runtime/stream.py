"""The signed live stream from the ranks to the notebook: what both ends agree on.

Every rank pushes its metric records and spans over a ZeroMQ PUSH socket (the sink,
:mod:`workbench.runtime.rank.sink`) to a PULL socket that the notebook's
:class:`~workbench.runtime.client.run.Run` binds. Why a side channel and not
``ipyparallel.datapub.publish_data``: that keeps only the latest value per key, so per-step
metrics would be lost or would have to be re-sent cumulatively. ZeroMQ queues every message.

Only the run's own ranks can feed the stream: every run has a fresh 256-bit secret, handed to
the ranks with the run's configuration over ipyparallel's own (authenticated) connection, and
every message travels as two frames ``[HMAC-SHA256(secret, body), body]``. The notebook checks
the MAC in constant time before it parses anything; a message that fails (another process
connecting to the port, a truncated or oversized frame) is dropped and counted, never acted on.
The secret itself never crosses the wire.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets

#: the largest message the notebook accepts (bytes); larger ones are dropped by ZeroMQ
MAX_MESSAGE_BYTES = 64 << 20


def new_secret() -> str:
    """A fresh per-run key (hex) for :func:`sign` / :func:`verify`."""
    return secrets.token_hex(32)


def sign(secret: str, body: bytes) -> bytes:
    """The message authentication code of ``body`` under ``secret``."""
    return hmac.new(bytes.fromhex(secret), body, hashlib.sha256).digest()


def verify(secret: str, frames: list[bytes], run_id: str) -> dict | None:
    """The message in ``frames`` if it is signed with ``secret`` and belongs to ``run_id``, else None."""
    if len(frames) != 2:
        return None
    mac, body = frames
    if not hmac.compare_digest(mac, sign(secret, body)):
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("run_id") != run_id:
        return None
    return message
