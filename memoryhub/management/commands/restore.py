"""`manage.py restore BACKUP`: bring a backup back into an empty data dir (a new embedded
PostgreSQL) or, with --database-url, into an empty external database (memoryhub/backup.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from memoryhub.backup import BackupError, restore
from memoryhub.environment import data_dir


class Command(BaseCommand):
    help = "Restore a backup made by `manage.py backup` into an empty data dir or an empty external database."
    # Run before the service (and its database) exists: no system checks, no database connection.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("backup", type=Path, help="the backup directory")
        parser.add_argument("--data-dir", type=Path, default=None,
                            help="the new, empty data dir (default: MEMORYHUB_DATA_DIR, ./var)")
        parser.add_argument("--database-url", default=os.environ.get("RESTORE_DATABASE_URL"),
                            help="restore into this empty external database instead of a new embedded one")
        parser.add_argument("--jobs", type=int, default=2, help="tables restored in parallel (default 2)")

    def handle(self, *args: Any, **options: Any) -> None:
        target = options["data_dir"] or data_dir()
        try:
            restore(source=options["backup"], data_dir=target, database_url=options["database_url"],
                    jobs=options["jobs"], progress=self.stdout.write)
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"restored into {target}; start it with "
                                             f"MEMORYHUB_DATA_DIR={target} make run"))
