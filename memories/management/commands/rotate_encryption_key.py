"""Re-seal every kept raw original with the current encryption key (docs/privacy.md, "Encryption at rest").

    MEMORYHUB_ENCRYPTION_KEYS=k2:<new>,k1:<old> manage.py rotate_encryption_key [--batch-size 500] [--dry-run]

Rows sealed with any other key are opened with it and sealed again with the first (current) key,
in batches, each its own transaction, with a progress line per batch. Resumable: an interrupted
run leaves every row sealed with one key or the other, and the next run picks up what is left.
Once it reports nothing left, the old key can be removed from the variable.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from memories.privacy.originals import Rotation, reseal_batch, rows_to_reseal
from memoryhub.encryption import VARIABLE, current_keyring


class Command(BaseCommand):
    help = "Re-encrypt kept raw originals with the current key (the first in MEMORYHUB_ENCRYPTION_KEYS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="Rows per transaction (default 500).")
        parser.add_argument("--dry-run", action="store_true", help="Only count the rows to re-encrypt.")

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = options["batch_size"]
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        keyring = current_keyring()
        if keyring.current_id is None:
            raise CommandError(f"{VARIABLE} is not set: there is no current key to re-encrypt with.")
        pending = rows_to_reseal(keyring)
        total = sum(pending.values())
        by_key = ", ".join(f"{key_id}: {count:,}" for key_id, count in sorted(pending.items()))
        if options["dry_run"]:
            self.stdout.write(f"would re-encrypt {total:,} rows to key {keyring.current_id}"
                              + (f" ({by_key})" if by_key else "") + "; nothing was changed")
            return
        if not total:
            self.stdout.write(f"nothing to re-encrypt: every row is sealed with key {keyring.current_id}")
            return
        self.stdout.write(f"re-encrypting {total:,} rows ({by_key}) to key {keyring.current_id}")
        rotation = Rotation()
        while reseal_batch(rotation, keyring=keyring, batch_size=batch_size):
            self.stdout.write(f"re-encrypted {rotation.resealed:,} / {total:,}")
        if rotation.unreadable:
            missing = ", ".join(f"{key_id}: {count:,}" for key_id, count in sorted(rotation.unreadable.items()))
            raise CommandError(
                f"{sum(rotation.unreadable.values()):,} rows could not be opened ({missing}): wrong key or "
                f"tampered data, or their key is not in {VARIABLE}. They were left as they are; add the key "
                "and run the command again.")
        self.stdout.write(f"done: {rotation.resealed:,} rows re-encrypted to key {keyring.current_id}; keys no "
                          f"longer used by any row can be removed from {VARIABLE}")
