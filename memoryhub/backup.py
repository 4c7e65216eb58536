"""Backup and restore of a whole MemoryHub deployment (docs/operations.md §10).

A backup is a directory:
* `database.dump` — `pg_dump --format=custom` of the database: one consistent snapshot (pg_dump
  reads everything in one repeatable-read transaction while the service keeps running), compressed,
  restorable table by table in parallel by `pg_restore`. Embeddings, revisions, erasure certificates,
  sealed webhook secrets and encrypted originals are rows like any other.
* `files/` — what lives beside the database in the data dir and a restore needs: `secrets.json`
  (SECRET_KEY, the JWT signing key and the API-key pepper: without them no key, session or sealed
  webhook secret works after a restore) and the teleport snapshot blobs (`teleport/`).
* `manifest.json` — when, from which database server version, row counts of the main tables, and the
  SHA-256 of every file, checked before anything is restored.

Not in it: Redis, which holds only what can be rebuilt (the broker's queue — the sweeps re-queue
what it held —, rate-limit windows, caches), and MEMORYHUB_ENCRYPTION_KEYS, which live in the
environment on purpose: keep them with your other secrets, apart from the backups.

The binaries are the embedded server's own (pgserver's PostgreSQL 16), which also dump an external
server of that major version. For an external PostgreSQL, its own backups (base backup + WAL
archiving, i.e. point-in-time recovery) are the better tool; see docs/operations.md §10.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memoryhub.embedded import EmbeddedPostgres, free_port, pgserver_bin
from memoryhub.files import file_sha256

DUMP_NAME = "database.dump"
MANIFEST_NAME = "manifest.json"
FILES_DIR = "files"
# Beside the database in the data dir: what a restore needs (see the module docstring).
DATA_FILES = ("secrets.json",)
DATA_DIRS = ("teleport",)
# Counted into the manifest and checked after a restore.
COUNTED_TABLES = ("accounts_organization", "stacks_stack", "memories_memory", "memories_memoryrevision",
                  "accounts_apikey")
FORMAT_VERSION = 1

Progress = Callable[[str], None]


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says why and what to do."""


def _counts(database_url: str) -> dict[str, int]:
    import psycopg
    from psycopg import sql

    counts: dict[str, int] = {}
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        for table in COUNTED_TABLES:
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists and exists[0]:
                row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
                counts[table] = int(row[0]) if row else 0
    return counts


def _run_streaming(argv: list[str], progress: Progress, *, label: str, wanted: Callable[[str], str | None]) -> None:
    """Run a pg tool, turning its --verbose lines into short progress lines; fail with its last words."""
    tail: list[str] = []
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        tail = [*tail, line.rstrip()][-20:]
        message = wanted(line)
        if message:
            progress(message)
    if process.wait() != 0:
        raise BackupError(f"{label} failed (exit {process.returncode}):\n" + "\n".join(tail))


def _table_line(prefix: str) -> Callable[[str], str | None]:
    """pg_dump / pg_restore --verbose name each table's data as they go; nothing else is shown."""
    def pick(line: str) -> str | None:
        marker = "processing data for table " if "processing data for table" in line else (
            "dumping contents of table " if "dumping contents of table" in line else "")
        if not marker:
            return None
        return f"{prefix} {line.split(marker, 1)[1].strip().strip(chr(34))}"
    return pick


@dataclass
class BackupResult:
    path: Path
    counts: dict[str, int]
    bytes: int


def backup(*, database_url: str, data_dir: Path, output: Path, progress: Progress = print) -> BackupResult:
    """Write a backup of the database and the data dir's restore-relevant files into `output` (a
    new or empty directory)."""
    if output.exists() and any(output.iterdir()):
        raise BackupError(f"{output} is not empty: give a new directory for the backup")
    output.mkdir(parents=True, exist_ok=True)
    counts = _counts(database_url)
    progress(f"backing up {counts.get('memories_memory', 0):,} memories of "
             f"{counts.get('stacks_stack', 0):,} stacks in {counts.get('accounts_organization', 0):,} schools")
    dump = output / DUMP_NAME
    _run_streaming([str(pgserver_bin() / "pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
                    "--verbose", f"--file={dump}", database_url],
                   progress, label="pg_dump", wanted=_table_line("  dumped"))
    files: dict[str, str] = {DUMP_NAME: file_sha256(dump)}
    for name in DATA_FILES:
        source = data_dir / name
        if source.is_file():
            target = output / FILES_DIR / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            target.chmod(0o600)  # secrets
            files[f"{FILES_DIR}/{name}"] = file_sha256(target)
    for name in DATA_DIRS:
        source = data_dir / name
        if source.is_dir():
            shutil.copytree(source, output / FILES_DIR / name)
            for path in sorted((output / FILES_DIR / name).rglob("*")):
                if path.is_file():
                    files[str(path.relative_to(output))] = file_sha256(path)
    server_version = _server_version(database_url)
    manifest = {"format": FORMAT_VERSION, "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "postgres_server_version": server_version, "counts": counts, "files": files}
    (output / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    progress(f"backup written to {output} ({size / 1e6:,.1f} MB, {len(files)} files)")
    return BackupResult(path=output, counts=counts, bytes=size)


def _server_version(database_url: str) -> str:
    import psycopg

    with psycopg.connect(database_url, connect_timeout=5) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else ""


def read_manifest(source: Path) -> dict[str, Any]:
    """The backup's manifest, after checking every file it names against its SHA-256."""
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source} is not a MemoryHub backup (no readable {MANIFEST_NAME}): {exc}") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BackupError(f"backup format {manifest.get('format')!r} is not {FORMAT_VERSION}")
    for name, digest in manifest.get("files", {}).items():
        path = source / name
        if not path.is_file() or file_sha256(path) != digest:
            raise BackupError(f"{name} is missing or damaged (its SHA-256 differs from the manifest's)")
    return manifest


def _database_is_empty(database_url: str) -> bool:
    import psycopg

    with psycopg.connect(database_url, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    return not row or int(row[0]) == 0


def restore(*, source: Path, data_dir: Path, database_url: str | None = None, jobs: int = 2,
            progress: Progress = print) -> dict[str, int]:
    """Restore a backup into an empty data dir (with a new embedded PostgreSQL in it) or, with
    `database_url`, into an empty external database. Returns the restored row counts, which must
    equal the manifest's."""
    manifest = read_manifest(source)
    progress(f"backup of {manifest['created_at']} verified ({len(manifest['files'])} files)")
    embedded: EmbeddedPostgres | None = None
    if database_url is None:
        if data_dir.exists() and any(data_dir.iterdir()):
            raise BackupError(f"{data_dir} is not empty: restore into a new data dir (MEMORYHUB_DATA_DIR)")
        embedded = EmbeddedPostgres(data_dir / "postgres", free_port(), log_path=data_dir / "logs" / "postgres.log")
        embedded.prepare()
        embedded.start()
        embedded.ensure_database("memoryhub")
        database_url = embedded.url("memoryhub")
        progress(f"embedded PostgreSQL created in {data_dir / 'postgres'}")
    elif not _database_is_empty(database_url):
        raise BackupError("the target database is not empty: restore into a new, empty database")
    try:
        _run_streaming([str(pgserver_bin() / "pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
                        "--verbose", f"--jobs={max(1, jobs)}", f"--dbname={database_url}", str(source / DUMP_NAME)],
                       progress, label="pg_restore", wanted=_table_line("  restored"))
        counts = _counts(database_url)
    finally:
        if embedded is not None:
            embedded.stop()
    for name in manifest["files"]:
        if name.startswith(FILES_DIR + "/"):
            target = data_dir / name.removeprefix(FILES_DIR + "/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target)
    if (data_dir / "secrets.json").exists():
        (data_dir / "secrets.json").chmod(0o600)
    if counts != manifest["counts"]:
        raise BackupError(f"restored counts {counts} differ from the backup's {manifest['counts']}")
    progress(f"restored {counts.get('memories_memory', 0):,} memories; counts match the backup")
    return counts
