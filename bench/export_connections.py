"""Streamed downloads one after another on one keep-alive connection.

    .venv/bin/python bench/export_connections.py                  # 50 API archive exports
    .venv/bin/python bench/export_connections.py --exports 20 --what dashboard

One run against real embedded Postgres and Redis and the real ASGI app under uvicorn (one worker,
the default pool of DB_POOL_MAX_SIZE connections), as bench/http_overhead.py. One stack with
`--memories` memories; one client with ONE persistent connection does, `--exports` times:

* a streamed download: `GET /api/v1/stacks/<stack>/export/archive` with the stack's own key
  (`--what api`), or in turn the dashboard's `export.json`, `archive.zip` and audit CSV with a
  school admin's session (`--what dashboard`); read to its end and checked complete (the ZIP
  opens and tests clean, the JSON parses, the CSV's last line ends);
* then a plain `GET /api/v1/stacks/<stack>/` with the same key, timed.

Printed: one line per download (status, complete or the error, seconds, the plain GET's status and
milliseconds, the database sessions open to the bench database besides the bench's own), then
the totals. A download path that keeps a pooled connection checked out shows up as sessions
climbing to the pool's size, then the plain GET answering 503 after the pool's 5 s timeout.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, web_server
from bench.synthetic import bulk_load_memories


def _complete(path: str, body: bytes) -> str:
    """'' when `body` is a whole download of `path`, else what is wrong with it."""
    try:
        if path.endswith(("/export/archive", "/archive.zip")):
            with zipfile.ZipFile(io.BytesIO(body)) as archive:
                bad = archive.testzip()
                return f"bad entry {bad}" if bad else ("" if "manifest.json" in archive.namelist() else "no manifest")
        if path.endswith("/export.json"):
            json.loads(body)
            return ""
        return "" if body.endswith((b"\r\n", b"\n")) else "cut off"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exports", type=int, default=50)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--what", choices=("api", "dashboard"), default="api")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with bench_environment("export-connections") as env:
        import httpx
        from django.conf import settings
        from django.db import connection
        from django.test import Client

        from accounts.models import Membership, Organization, User
        from accounts.services import api_key_issue
        from stacks.models import Stack

        org = Organization.objects.create(slug="bench-exports", name="Bench Exports", tier="unlimited")
        stack = Stack.objects.create(organization=org, slug="student-0001")
        bulk_load_memories([(stack.pk, args.memories)], defer_indexes=False)
        user = User.objects.create_user(username="bench-exports", email="bench-exports@example.test",
                                        password="x" * 20)
        Membership.objects.create(user=user, organization=org, role=Membership.Role.ADMIN)
        _, secret = api_key_issue(organization=org, user=user, stack_id=stack.pk, name="agent", read_only=False)
        browser = Client()
        browser.force_login(user)
        session = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}
        key = {"Authorization": f"Bearer {secret}"}
        plain = f"/api/v1/stacks/{stack.slug}/"
        downloads: list[tuple[str, dict[str, str], dict[str, str]]]
        if args.what == "api":
            downloads = [(f"/api/v1/stacks/{stack.slug}/export/archive", key, {})]
        else:
            base = f"/dashboard/students/{stack.slug}"
            downloads = [(f"{base}/export.json", {}, session), (f"{base}/archive.zip", {}, session),
                         ("/dashboard/audit/?format=csv", {}, session)]

        def sessions() -> int:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid()")
                return int(cursor.fetchone()[0])

        # Exports are throttled like any request: raised so the bench measures connections, not the limiter.
        extra_env = {"THROTTLE_REQUEST_RATE": "10000000/min"}
        rows: list[dict[str, Any]] = []
        with web_server(env, extra_env=extra_env) as url, httpx.Client(base_url=url, timeout=30) as client:
            log(f"server at {url}, pool of {settings.DB_POOL_MAX_SIZE}; {args.exports} downloads on one connection")
            for n in range(args.exports):
                path, headers, cookies = downloads[n % len(downloads)]
                client.cookies.clear()
                client.cookies.update(cookies)
                t0 = time.perf_counter()
                try:
                    response = client.get(path, headers=headers)
                    status: int | str = response.status_code
                    problem = _complete(path, response.content) if status == 200 else response.text[:80]
                except httpx.HTTPError as exc:
                    status, problem = "-", type(exc).__name__
                seconds = time.perf_counter() - t0
                client.cookies.clear()
                t1 = time.perf_counter()
                try:
                    plain_status: int | str = client.get(plain, headers=key).status_code
                except httpx.HTTPError as exc:
                    plain_status = type(exc).__name__
                plain_ms = (time.perf_counter() - t1) * 1000
                row = {"n": n + 1, "path": path.rsplit("/", 1)[-1], "status": status, "complete": not problem,
                       "problem": problem, "s": seconds, "plain": plain_status, "plain_ms": plain_ms,
                       "db_sessions": sessions()}
                rows.append(row)
                print(f"{row['n']:3d} {row['path']:<20} {row['status']!s:>4} {problem or 'complete':<24}"
                      f" {seconds:6.2f} s   plain GET {plain_status!s:>4} {plain_ms:8.1f} ms"
                      f"   db sessions {row['db_sessions']}", flush=True)
        good = [r for r in rows if r["status"] == 200 and r["complete"]]
        plain_ok = [r for r in rows if r["plain"] == 200]
        slow = [r for r in rows if r["plain_ms"] > 1000]
        print(f"\n{args.what}: {len(good)}/{len(rows)} downloads 200 and complete; "
              f"plain GET 200 after {len(plain_ok)}/{len(rows)}, over 1 s after {len(slow)}; "
              f"plain GET max {max(r['plain_ms'] for r in rows):.0f} ms; "
              f"db sessions max {max(r['db_sessions'] for r in rows)} (pool {settings.DB_POOL_MAX_SIZE})")


if __name__ == "__main__":
    main()
