"""How CPython runs in our long-lived processes: what they load at start is frozen out of the cyclic
garbage collector (web and worker processes), and a web process hands the GIL over sooner.

Garbage collection (docs/operations.md §7 "Garbage collection pauses", which has the figures): a
web process holds hundreds of thousands of objects from its imports (Django, DRF, web3, the MCP SDK,
the URL conf and every view), all alive for its whole life. CPython's collector walks every one of
them on each full (oldest-generation) collection, with the GIL held: under bench/soak.py's load such
a collection stopped a web process for a noticeable part of a second (every request in that process,
and its event loop, waited), several times a minute.
`gc.freeze()` (the standard library's own tool for this) moves everything alive at that moment
into a permanent generation the collector no longer walks, so a full collection only looks at
what the process made since. The thresholds stay CPython's: a larger first-generation threshold
was tried and not kept — fewer young collections, each pausing longer, for about the same total.

Nothing is leaked: reference counting still frees every frozen object that is dropped; only a
reference cycle among frozen objects would stay (they were loaded for the process's life).
`PYTHON_GC_TUNING=false` turns it off (the interpreter's defaults, nothing frozen).

GIL hand-over (docs/operations.md §8): a web process serves its requests on a pool of threads that
share one GIL. A request thread gives the GIL up while it waits for PostgreSQL or Redis; when the
answer comes back it must get the GIL again, and if another request's thread is busy running Python
meanwhile, CPython makes it wait until that thread has run for the switch interval: 5 ms by
default. A request makes several such round trips (authentication, the stack lookup, its
statements, the commit), and the event loop that reads requests and writes answers needs the GIL
too, so under load each could wait up to 5 ms. At 1 ms the waits are a fifth as long, for no
measurable CPU (docs/operations.md §8). `PYTHON_GIL_SWITCH_MS` sets it (1 by default;
5 is CPython's own).
"""

from __future__ import annotations

import gc
import sys

from django.conf import settings


def settle_heap() -> None:
    """Freeze what is alive now out of the collector's walks (unless turned off). Call once a
    process has loaded what it keeps for life."""
    if settings.PYTHON_GC_TUNING:
        gc.collect()  # what is garbage already is freed, not frozen
        gc.freeze()


def shorten_gil_switch_interval() -> None:
    """Set this process's GIL switch interval from the settings. Call once, in a web process."""
    sys.setswitchinterval(settings.PYTHON_GIL_SWITCH_MS / 1000)
