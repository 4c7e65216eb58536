"""`manage.py backup DIR`: a consistent backup of the database and the data dir's secrets and
blobs, with progress (memoryhub/backup.py; docs/operations.md §10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from memoryhub.backup import BackupError, backup
from memoryhub.database import database_conninfo


class Command(BaseCommand):
    help = "Back up the database (pg_dump) and the data dir's secrets and teleport blobs into a new directory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("output", type=Path, help="a new (or empty) directory for the backup")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = backup(database_url=database_conninfo(), data_dir=Path(settings.DATA_DIR),
                            output=options["output"], progress=self.stdout.write)
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"backup complete: {result.path}"))
