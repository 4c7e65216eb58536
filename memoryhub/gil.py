"""How often a web process's running thread hands the GIL to a thread waiting for it.

WHY (docs/operations.md §8 "GIL hand-over"): a web process serves its requests on a pool of
threads that share one GIL. A request thread gives the GIL up while it waits for PostgreSQL or
Redis; when the answer comes back it must get the GIL again, and if another request's thread is
busy running Python meanwhile, CPython makes it wait until that thread has run for the switch
interval: 5 ms by default. A request makes several such round trips (authentication, the stack
lookup, its statements, the commit), so under load each one of them could add up to 5 ms, and so
could each turn of the event loop that reads the requests and writes the answers. At 1 ms the
waits are a fifth as long; the extra hand-overs cost no measurable CPU (bench/soak.py, README
"Benchmarks").

`PYTHON_GIL_SWITCH_MS` sets it (1 by default; 5 is CPython's own).
"""

from __future__ import annotations

import sys

from django.conf import settings


def shorten_gil_switch_interval() -> None:
    """Set this process's switch interval from the settings. Call once, in a web process."""
    sys.setswitchinterval(settings.PYTHON_GIL_SWITCH_MS / 1000)
