"""The cyclic garbage collector of a long-running process: what is loaded at start is frozen out of it.

WHY (docs/operations.md §7 "Garbage collection pauses"): a web process holds ~300,000 objects
from its imports (Django, DRF, web3, the MCP SDK, the URL conf and every view), all alive
for its whole life. CPython's collector walks every one of them on each full (oldest-generation)
collection, with the GIL held: measured under bench/soak.py's load on a 2-core box, such a
collection stopped a web process for 0.35-0.58 s (every request in that process, and its event
loop, waited), two to three times a minute.
`gc.freeze()` (the standard library's own tool for this) moves everything alive at that moment
into a permanent generation the collector no longer walks, so a full collection only looks at
what the process made since. The thresholds stay CPython's: a larger first-generation threshold
(20,000) was tried and not kept — young collections ran ~20x less often but paused ~30 ms each (up
to 95 ms), for about the same total.

Nothing is leaked: reference counting still frees every frozen object that is dropped; only a
reference cycle among frozen objects would stay (they were loaded for the process's life).
`PYTHON_GC_TUNING=false` turns it off (the interpreter's defaults, nothing frozen).
"""

from __future__ import annotations

import gc

from django.conf import settings


def settle_heap() -> None:
    """Freeze what is alive now out of the collector's walks (unless turned off). Call once a
    process has loaded what it keeps for life."""
    if settings.PYTHON_GC_TUNING:
        gc.collect()  # what is garbage already is freed, not frozen
        gc.freeze()
