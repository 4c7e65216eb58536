"""Background work runs at a lower CPU priority than interactive work, in PostgreSQL too
(docs/architecture.md §5.7 "CPU priority").

* **Bulk requests** (`lower_for_bulk`). The bulk lane bounds how many bulk requests run; this
  decides who gets a core first while they do. From a request's admission to the lane until its view
  returns, the thread serving it and the PostgreSQL backend serving its connection run at niceness
  `LANES_BULK_NICE`; then both go back to what they were.
* **The worker's backends** (`backend_follows_worker`). The runner moves the worker's niceness
  with the embedding lag (memoryhub.worker_priority); before each task, the backend of the worker's
  connection is given the same niceness, so its statements (a batch of vectors into the HNSW index)
  yield like the worker's own Python does.
* **Locks held by background work** (`interactive_priority`). While the worker holds stack locks
  that interactive writes wait for (storing a batch of vectors), its thread and backend run at the
  interactive priority, so the requests behind the lock wait only for the statements, not for a
  turn on a busy core; then both go back to what they were.

With every core busy the kernel then runs the interactive requests' threads and backends first and
gives background work what they leave, instead of an equal share; work that waits is only delayed.
Every PostgreSQL backend leads a session of its own, so under Linux's autogroup it is alone in its
scheduling group, which a process's niceness does not weigh against the others: a backend's
group is given the same niceness as the backend, where this process has CAP_SYS_ADMIN (without it
the kernel takes one such change a tenth of a second).
Going back to a higher priority needs CAP_SYS_NICE (root has it; so does a service given it, e.g.
systemd's `AmbientCapabilities=CAP_SYS_NICE`). Without it, or off Linux, nothing is lowered. A
backend is reniced only when PostgreSQL runs on this machine (its host is loopback or a socket, and
the process with the backend's pid is a `postgres`), since a remote backend's pid means nothing
here. `LANES_BULK_NICE=0` keeps bulk requests at the interactive priority; `WORKER_CPU_NICE=0`
the worker and its backends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection

from memoryhub.embedded import session_group_nice, set_session_group_nice

logger = logging.getLogger(__name__)

_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


@functools.cache
def can_restore_priority() -> bool:
    """Whether this process may lower a niceness it raised: tried once, on a thread of its own."""
    if not sys.platform.startswith("linux"):
        return False
    allowed = False

    def probe() -> None:
        nonlocal allowed
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, before + 1))
            os.setpriority(os.PRIO_PROCESS, tid, before)
            allowed = True
        except OSError:
            allowed = False

    thread = threading.Thread(target=probe, name="nice-probe")
    thread.start()
    thread.join()
    if not allowed:
        logger.info("background work keeps the interactive CPU priority: raising a priority back needs CAP_SYS_NICE")
    return allowed


def _database_is_local() -> bool:
    host = str(settings.DATABASES["default"].get("HOST") or "")
    return host in _LOCAL_HOSTS or host.startswith("/")


def _local_backend_pid() -> int | None:
    """The pid of this thread's PostgreSQL backend when it is a process of this machine."""
    if not _database_is_local():
        return None
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    try:
        is_postgres = Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return None
    return pid if is_postgres else None


def _set_nice(pid: int, nice: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        return False
    return True


_CAP_SYS_ADMIN = 21


@functools.cache
def may_change_session_groups() -> bool:
    """Whether this process may set session groups' niceness as often as it likes: without
    CAP_SYS_ADMIN the kernel takes one change a tenth of a second from all processes together, and a
    group left lowered would cost its backend's connection."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> _CAP_SYS_ADMIN & 1)


def _backend_nice(pid: int) -> tuple[int, int | None]:
    """A backend's niceness and its session group's (None: it leads no session, there is no
    autogroup, or the groups are not ours to change)."""
    group = session_group_nice(pid) if may_change_session_groups() and os.getsid(pid) == pid else None
    return os.getpriority(os.PRIO_PROCESS, pid), group


def _set_backend_nice(pid: int, nice: int, group: int | None) -> bool:
    """Set a backend's niceness, and its session group's when `group` is not None; False if either
    could not be set."""
    if not _set_nice(pid, nice):
        return False
    return group is None or set_session_group_nice(pid, group)


def _move_backend(pid: int, nice: int) -> tuple[int, int | None] | None:
    """Put a backend, and its session group where `_backend_nice` reads one, at niceness `nice`.
    Returns what both were when anything had to move (for `_set_backend_nice` to put back), else
    None."""
    process_nice, group_nice = _backend_nice(pid)
    if process_nice == nice and group_nice in (None, nice):
        return None
    _set_backend_nice(pid, nice, None if group_nice is None else nice)
    return process_nice, group_nice


def lower_for_bulk() -> Callable[[], None]:
    """Run this thread and its database backend at `LANES_BULK_NICE`; returns the call that puts
    both back (call it on this thread, before its connection goes back to the pool)."""
    nice = settings.LANES_BULK_NICE
    if nice <= 0 or not can_restore_priority():
        return lambda: None
    backend = _local_backend_pid()  # first: a database that cannot answer leaves nothing lowered
    tid = threading.get_native_id()
    thread_before = os.getpriority(os.PRIO_PROCESS, tid)
    _set_nice(tid, max(nice, thread_before))
    lowered: tuple[int, int | None] | None = None  # what was changed: the niceness and group's before
    if backend is not None:
        with contextlib.suppress(OSError):
            process_nice, group_nice = _backend_nice(backend)
            if _set_nice(backend, max(nice, process_nice)):
                group_lowered = group_nice is not None and set_session_group_nice(backend, max(nice, group_nice))
                lowered = (process_nice, group_nice if group_lowered else None)

    def restore() -> None:
        _set_nice(tid, thread_before)
        if backend is not None and lowered is not None and not _set_backend_nice(backend, *lowered):
            # A backend left at low priority must not serve interactive requests from the pool.
            logger.warning("could not restore a database backend's CPU priority; closing its connection")
            with contextlib.suppress(Exception):
                connection.connection.close()

    return restore


def backend_follows_worker(**_: object) -> None:
    """`task_prerun` in the worker: its connection's backend at the worker process's own niceness."""
    if not can_restore_priority():
        return
    try:
        backend = _local_backend_pid()
    except DatabaseError:
        return  # the task meets the outage itself, and says so
    if backend is None:
        return
    with contextlib.suppress(OSError):
        _move_backend(backend, os.getpriority(os.PRIO_PROCESS, 0))


@contextlib.contextmanager
def interactive_priority() -> Iterator[None]:
    """Run this thread and its database backend at the interactive priority (the normal scheduling
    policy, niceness 0) for the block, then put both back as they were (docs/architecture.md §5.7
    "Locks at the interactive priority"). For background work while it holds locks that
    interactive requests wait for: at its own low priority, every statement of its transaction
    would first wait for a turn on a busy core, and the requests behind the lock with it. Without
    CAP_SYS_NICE, or off Linux, nothing changes; a database that cannot answer leaves the backend
    as it is (the block meets the outage itself)."""
    if not can_restore_priority():
        yield
        return
    tid = threading.get_native_id()
    thread_policy, thread_nice = os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)
    if thread_policy == os.SCHED_IDLE:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    if thread_nice > 0:
        _set_nice(tid, 0)
    backend: int | None = None
    backend_before: tuple[int, int | None] | None = None  # what the backend was, when it was raised
    with contextlib.suppress(DatabaseError, OSError):
        backend = _local_backend_pid()
        if backend is not None:
            backend_before = _move_backend(backend, 0)
    try:
        yield
    finally:
        if thread_nice > 0:
            _set_nice(tid, thread_nice)
        if thread_policy == os.SCHED_IDLE:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        if backend is not None and backend_before is not None:
            # Best effort: a backend left at the interactive priority only competes as an equal.
            _set_backend_nice(backend, *backend_before)
