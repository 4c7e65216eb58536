"""How long a client should wait before retrying a 503: the outage's expected length, not a flat
minute (docs/kernle-protocol.md §7.2).

The runner restarts a dead part within a second or two, so most outages last seconds; a client told
"60" waits a minute for nothing. With no better forecast, the best guess of how much longer an
outage lasts is how long it has lasted so far: Retry-After starts at RETRY_MIN_SECONDS and grows with
the outage this process has seen, up to RETRY_MAX_SECONDS, with ±20 % jitter so that clients told
at the same moment do not all come back at the same moment. Per process and per part (database,
cache, …); an outage is over when the part has not failed for OUTAGE_GAP_SECONDS.
"""

from __future__ import annotations

import random
import threading
import time

RETRY_MIN_SECONDS = 2.0
RETRY_MAX_SECONDS = 30.0
OUTAGE_GAP_SECONDS = 10.0
JITTER = 0.2

_lock = threading.Lock()
_outages: dict[str, tuple[float, float]] = {}  # part -> (first failure, latest failure), monotonic


def retry_after_seconds(part: str, *, now: float | None = None) -> int:
    """Record a failure of `part` now and return the whole seconds to put in Retry-After."""
    moment = time.monotonic() if now is None else now
    with _lock:
        started, latest = _outages.get(part, (moment, moment))
        if moment - latest > OUTAGE_GAP_SECONDS:
            started = moment  # the previous outage ended: a new one starts now
        _outages[part] = (started, moment)
    expected = min(max(moment - started, RETRY_MIN_SECONDS), RETRY_MAX_SECONDS)
    jittered = expected * random.uniform(1 - JITTER, 1 + JITTER)  # spreading retries, not a secret
    return max(1, round(jittered))
