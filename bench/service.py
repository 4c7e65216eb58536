"""The whole service as `make run` runs it, for benchmarks and fault tests: `runner_service()`.

It starts the real runner (`python -m memoryhub.runner`: embedded PostgreSQL and Redis, Anvil, the
web server, the worker and beat) in its own data dir on free ports, in its own process group,
waits for /readyz 200 and on exit stops everything the runner started (SIGINT to the group, then
SIGKILL after `stop_timeout`). `RunnerService.make_school()` then makes an unlimited school with
its stacks, keys and an admin's browser session through the service's own `manage.py`. Used by
bench/soak.py and tests/faults/test_kill9.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from memoryhub.embedded import free_port  # noqa: E402

# The first line of a record in the service's plain log format (settings.LOGGING).
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? (?P<level>[A-Z]+) ")
# A traceback's line naming an exception ("psycopg.errors.X: …"); other processes' lines (uvicorn's
# access log) interleave with it in the runner's output.
_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Timeout)\b")


@dataclass
class RunnerService:
    base_url: str
    data_dir: Path  # MEMORYHUB_DATA_DIR
    env: dict[str, str]  # the runner's environment (a `manage.py` with it reaches this service)
    runner: subprocess.Popen[bytes]
    log_path: Path  # the runner's own output (its children's too)
    ready_seconds: float = 0.0  # from start to the first /readyz 200
    code_dir: Path = BASE_DIR  # the checkout it runs from
    redis_port: int = field(init=False)

    def __post_init__(self) -> None:
        self.redis_port = int(self.env["MEMORYHUB_REDIS_PORT"])

    @property
    def database_url(self) -> str:
        """The embedded PostgreSQL's URL, from the runner's runtime file."""
        return str(json.loads((self.data_dir / "runtime.json").read_text())["database_url"])

    def log_lines(self) -> list[str]:
        """The runner's output so far (its children's too), line by line."""
        return self.log_path.read_text(errors="replace").splitlines()

    def web_processes_replaced(self) -> list[str]:
        """uvicorn's supervisor's lines for each web process it replaced: one that exited, or one
        that did not answer its health ping in time and was killed. Every connection such a process
        held ends without an answer."""
        return [line for line in self.log_lines() if "Child process [" in line and "died" in line]

    def errors_logged(self) -> list[str]:
        """Each ERROR or CRITICAL record in the runner's log: its first line, and after "<-" the
        last line of its traceback (the exception and its message, as the service's safe log wrote
        it). What a bench's 5xx or failed task was, kept after the throw-away data dir is gone."""
        records: list[tuple[str, str, str]] = []  # (first line, level, exception)
        for line in self.log_lines():
            if (start := _LOG_RECORD.match(line)) is not None:
                records.append((line, start.group("level"), ""))
            elif records and _EXCEPTION_LINE.match(line):
                records[-1] = (*records[-1][:2], line.strip())  # the last one is what the record died of
        return [f"{first}  <- {cause}" if cause else first for first, level, cause in records
                if level in ("ERROR", "CRITICAL")]

    def worker_priority_switches(self) -> list[str]:
        """What the runner said at each change of the worker's priority and of the embedding hold
        (memoryhub/worker_priority.py), in order, without its `[memoryhub] ` prefix."""
        said = ("embedding is over", "embedding caught up", "embedding waits", "embedding resumes")
        return [line.split("] ", 1)[-1] for line in self.log_lines() if any(words in line for words in said)]

    def ready(self) -> bool:
        """/readyz answers 200 now. Raises at once when the runner itself has exited."""
        if self.runner.poll() is not None:
            raise RuntimeError(f"the runner exited with {self.runner.returncode}:\n"
                               f"{self.log_path.read_text(errors='replace')[-3000:]}")
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


    def make_school(self, slug: str, stacks: int, *, stack_bound_keys: bool = True,
                    webhook_url: str = "") -> dict[str, Any]:
        """An unlimited school `slug` with `stacks` stacks (`<slug>-<n>`) and one API key each (bound to its
        stack, or a school key), optionally a webhook endpoint for every event, made by the service's
        `manage.py` (so through the service's own services). Returns {"agents": [{"stack", "secret"}],
        "cookie": the admin's session cookie, "Name=value"}."""
        params = {"slug": slug, "stacks": stacks, "stack_bound_keys": stack_bound_keys, "webhook_url": webhook_url}
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", SCHOOL_SCRIPT], cwd=self.code_dir,
                              env={**self.env, "MEMORYHUB_BENCH_SCHOOL": json.dumps(params)},
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"making the school failed:\n{done.stderr[-3000:]}")
        [line] = [x for x in done.stdout.splitlines() if x.startswith("SCHOOL=")]
        return dict(json.loads(line.removeprefix("SCHOOL=")))


# Runs inside `manage.py shell` of the service under test; its parameters come in MEMORYHUB_BENCH_SCHOOL.
SCHOOL_SCRIPT = """
import json, os
from django.conf import settings
from django.test import Client
from accounts.models import Organization
from accounts.services import api_key_issue, school_create
from stacks.services import stack_create
p = json.loads(os.environ["MEMORYHUB_BENCH_SCHOOL"])
org, admin, _ = school_create(name=p["slug"].replace("-", " ").title(), admin_email=p["slug"] + "@example.org",
                              slug=p["slug"])
Organization.objects.filter(pk=org.pk).update(tier="unlimited")
org.refresh_from_db()
agents = []
for n in range(p["stacks"]):
    stack = stack_create(organization=org, slug=f"{p['slug']}-{n:03d}")
    _, secret = api_key_issue(organization=org, user=admin, stack_id=stack.pk if p["stack_bound_keys"] else None,
                              name=f"{p['slug']} client {n}", stack_agent=bool(p["stack_bound_keys"]))
    agents.append({"stack": stack.slug, "secret": secret})
if p["webhook_url"]:
    from webhooks.services import endpoint_create
    endpoint_create(organization=org, url=p["webhook_url"], event_types=["*"])
browser = Client()
browser.force_login(admin)
cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"
print("SCHOOL=" + json.dumps({"agents": agents, "cookie": cookie}))
"""


# Where `make install` puts the ONNX export of the embedding model (Makefile, ONNX_DIR).
ONNX_EXPORT = Path("build") / "models" / "all-MiniLM-L6-v2"


def checkout_env(code_dir: Path) -> dict[str, str]:
    """What a checkout of the code needs to embed as `make run` does in it.

    A `git worktree` made for an A/B has no `build/` of its own, and without the ONNX export its
    service embeds with torch instead (memories/search/embeddings.py): several times slower, under
    another model id. A comparison would then measure the two runtimes, not the two versions of the
    code. So such a checkout is pointed at this checkout's export (the same pinned weights) or, when
    the bench itself runs from a worktree, at the export of the checkout it was added from; left
    alone when it has one or the caller chose one with MINILM_ONNX_DIR, and said so when none is
    found."""
    if (code_dir / ONNX_EXPORT).is_dir() or "MINILM_ONNX_DIR" in os.environ:
        return {}
    for checkout in (BASE_DIR, main_checkout(BASE_DIR)):
        if checkout is not None and (checkout / ONNX_EXPORT).is_dir():
            return {"MINILM_ONNX_DIR": str(checkout / ONNX_EXPORT)}
    print(f"[bench] no ONNX export ({ONNX_EXPORT}) in {code_dir} nor in a checkout it could borrow one from: "
          "its service embeds with torch (`make install` makes the export; MINILM_ONNX_DIR names one)", flush=True)
    return {}


def main_checkout(checkout: Path) -> Path | None:
    """The checkout a `git worktree` was added from (the checkout itself when it is not one);
    None outside git."""
    done = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=checkout,
                          capture_output=True, text=True, check=False)
    return Path(done.stdout.strip()).parent if done.returncode == 0 else None


def runner_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment without DATABASE_URL / REDIS_URL (the runner starts its own),
    with `data_dir` and free ports for the web server, PostgreSQL, Redis and Anvil; `extra` last."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(MEMORYHUB_DATA_DIR=str(data_dir), PORT=str(free_port()), MEMORYHUB_PG_PORT=str(free_port()),
               MEMORYHUB_REDIS_PORT=str(free_port()), MEMORYHUB_ANVIL_PORT=str(free_port()))
    env.update(extra)
    return env


@contextmanager
def runner_service(data_dir: Path, log_path: Path, *, extra_env: dict[str, str] | None = None,
                   ready_timeout: float = 300.0, stop_timeout: float = 90.0,
                   code_dir: Path = BASE_DIR) -> Iterator[RunnerService]:
    """The real runner with its data in `data_dir` (made if missing), ready; stopped on exit.
    `code_dir`: the checkout it runs from (another one: an A/B of two versions of the code)."""
    env = runner_env(data_dir, **checkout_env(code_dir), **(extra_env or {}))
    base_url = f"http://127.0.0.1:{env['PORT']}"
    started = time.monotonic()
    with open(log_path, "ab") as out:
        runner = subprocess.Popen([sys.executable, "-m", "memoryhub.runner"], cwd=code_dir, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    service = RunnerService(base_url, data_dir, env, runner, log_path, code_dir=code_dir)
    try:
        deadline = started + ready_timeout
        while not service.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service was not ready in {ready_timeout:.0f} s")
            time.sleep(0.5)
        service.ready_seconds = time.monotonic() - started
        yield service
    finally:
        # The group may be gone already (the runner exited: `ready()` raised with its log), and a
        # ProcessLookupError here would hide that error.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGINT)
        try:
            runner.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(10)
