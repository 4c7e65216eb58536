"""`make run`: start the whole service on one machine and stop all of it on Ctrl-C / SIGTERM.

Unless DATABASE_URL / REDIS_URL point at external servers, this starts embedded PostgreSQL
(+pgvector) and Redis with data under MEMORYHUB_DATA_DIR (default ./var), migrates, then runs the
ASGI server (HTTP + websockets), one Celery worker and exactly one Celery beat. Every child is
supervised: one that dies is restarted with back-off, and on shutdown everything this process
started is stopped, in reverse order, before it exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis, ManagedProcess

BASE_DIR = Path(__file__).resolve().parent.parent
MAX_BACKOFF_SECONDS = 30.0


def log(message: str) -> None:
    print(f"[memoryhub] {message}", flush=True)


class Supervisor:
    """Keeps a list of children alive; restarts a dead one with exponential back-off."""

    def __init__(self) -> None:
        self.children: list[ManagedProcess] = []
        self.backoff: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.stopping = False

    def add(self, child: ManagedProcess) -> None:
        child.start()
        log(f"started {child.name} (pid {child.pid})")
        self.children.append(child)

    def watch_once(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.running():
                continue
            if child.name not in self.restart_at:
                delay = self.backoff.get(child.name, 1.0)
                log(f"{child.name} exited with code {child.returncode()}; restarting in {delay:.0f}s")
                self.restart_at[child.name] = now + delay
                self.backoff[child.name] = min(delay * 2, MAX_BACKOFF_SECONDS)
            elif now >= self.restart_at[child.name]:
                del self.restart_at[child.name]
                child.stop(timeout=1)
                child.start()
                log(f"restarted {child.name} (pid {child.pid})")

    def stop_all(self) -> None:
        for child in reversed(self.children):
            log(f"stopping {child.name}")
            child.stop()


def main() -> int:
    from django.core.exceptions import ImproperlyConfigured

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")
    try:
        from memoryhub.environment import data_dir, env_int, env_str

        data = data_dir()
        host = env_str("HOST", "127.0.0.1")
        port = env_int("PORT", 8000, minimum=1, maximum=65535)
        pg_port = env_int("MEMORYHUB_PG_PORT", 54320, minimum=1, maximum=65535)
        redis_port = env_int("MEMORYHUB_REDIS_PORT", 63790, minimum=1, maximum=65535)
        web_workers = env_int("WEB_WORKERS", 1, minimum=1)
        concurrency = env_int("CELERY_CONCURRENCY", 2, minimum=1)
        import memoryhub.settings  # noqa: F401  (validates every setting before anything starts)
    except ImproperlyConfigured as exc:
        log(f"configuration error: {exc}")
        return 2

    data.mkdir(parents=True, exist_ok=True)
    logs = data / "logs"
    env = dict(os.environ)
    env.setdefault("EMBEDDING_PROVIDER", "minilm")
    supervisor = Supervisor()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    try:
        if not env.get("DATABASE_URL"):
            postgres = EmbeddedPostgres(data / "postgres", pg_port, log_path=logs / "postgres.log")
            postgres.prepare()
            postgres.start()
            supervisor.children.append(postgres.process)
            postgres.ensure_database("memoryhub")
            env["DATABASE_URL"] = postgres.url("memoryhub")
            log(f"embedded PostgreSQL on 127.0.0.1:{pg_port} (data {postgres.pgdata})")
        else:
            log("using external PostgreSQL from DATABASE_URL")
        if not env.get("REDIS_URL"):
            redis_server = EmbeddedRedis(data / "redis", redis_port, log_path=logs / "redis.log")
            redis_server.prepare()
            redis_server.start()
            supervisor.children.append(redis_server.process)
            env["REDIS_URL"] = redis_server.url()
            log(f"embedded Redis on 127.0.0.1:{redis_port} (data {redis_server.data_dir})")
        else:
            log("using external Redis from REDIS_URL")

        python = sys.executable
        log("applying migrations")
        migrate = subprocess.run([python, "manage.py", "migrate", "--noinput"], cwd=BASE_DIR, env=env)
        if migrate.returncode != 0:
            log("migrations failed; stopping")
            return 1
        if supervisor.stopping:
            return 0

        supervisor.add(ManagedProcess(
            name="web",
            argv=[python, "-m", "uvicorn", "memoryhub.asgi:application", "--host", host, "--port", str(port),
                  "--workers", str(web_workers), "--no-access-log", "--lifespan", "off",
                  "--loop", "uvloop", "--http", "httptools"],
            env=env, cwd=BASE_DIR,
        ))
        supervisor.add(ManagedProcess(
            name="worker",
            argv=[python, "-m", "celery", "-A", "memoryhub", "worker", "--loglevel", "INFO",
                  "--concurrency", str(concurrency), "--hostname", "worker@%h"],
            env=env, cwd=BASE_DIR,
        ))
        supervisor.add(ManagedProcess(
            name="beat",
            argv=[python, "-m", "celery", "-A", "memoryhub", "beat", "--loglevel", "INFO",
                  "--schedule", str(data / "celerybeat-schedule")],
            env=env, cwd=BASE_DIR,
        ))
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - display only
        base_url = f"http://{shown_host}:{port}"
        log(f"MemoryHub is up: dashboard {base_url}/  API docs {base_url}/api/docs/  "
            f"readiness {base_url}/readyz  (Ctrl-C stops everything)")
        while not supervisor.stopping:
            supervisor.watch_once()
            time.sleep(0.5)
        return 0
    except Exception as exc:
        log(f"start-up failed: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()
        log("stopped; data kept in " + str(data))


if __name__ == "__main__":
    sys.exit(main())
