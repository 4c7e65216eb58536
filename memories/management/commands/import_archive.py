"""Import a stack archive (GET /api/v1/stacks/{stack}/export/archive) into a new, empty stack.

    manage.py import_archive memoryhub-ada-20261124T150000Z.zip --school hill-school --stack ada-restored

Everything goes through the sync engine and the memory services (memories.governance.archive.archive_import),
so the storage quota, the stack quota and the write kernel's transforms apply as to any write.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from accounts.models import Organization
from memories.governance.archive import archive_import
from memoryhub.errors import DomainError


class Command(BaseCommand):
    help = "Import a MemoryHub stack archive (ZIP) into a new, empty stack of a school."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("file", help="The archive (.zip) an export produced.")
        parser.add_argument("--school", required=True, help="The school's slug.")
        parser.add_argument("--stack", required=True, help="The new stack's id (slug); must be new or empty.")

    def handle(self, *args: Any, **options: Any) -> None:
        organization = Organization.objects.filter(slug=options["school"]).first()
        if organization is None:
            raise CommandError(f"No school with slug {options['school']!r}.")
        bar: tqdm | None = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, unit="memories", desc="importing", file=self.stderr._out)
            bar.update(done - bar.n)

        try:
            with open(options["file"], "rb") as source:
                result = archive_import(source=source, organization=organization, slug=options["stack"],
                                        progress=progress)
        except OSError as exc:
            raise CommandError(f"Cannot read {options['file']}: {exc.strerror}.") from None
        except DomainError as exc:
            raise CommandError(f"{exc.message} {exc.fields or ''}".strip()) from None
        finally:
            if bar is not None:
                bar.close()
        self.stdout.write(f"imported into stack {result.stack.slug}: {result.memories} memories "
                          f"({result.forgotten} forgotten restored), {result.checkpoints} checkpoints, "
                          f"{result.boot_config} boot config keys; {len(result.rejected)} rejected")
        for rejected in result.rejected[:20]:
            self.stdout.write(f"  rejected {rejected['kind']}:{rejected['record_id']}: {rejected['code']}")
