"""Rotate a secret kept in <data dir>/secrets.json, or end a pepper rotation's window.

The procedures, and what each rotation ends, are in docs/operations.md §4. A secret set in the
environment is rotated there instead; this command refuses to touch it. Running processes keep
the old value until they restart (`make run` again, or restart web, worker and beat).
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.selectors import keys_maybe_under_previous_pepper
from memoryhub.secrets import (
    VARIABLES,
    drop_previous_peppers,
    pepper_rotated_at,
    rotate_kept_secret,
    secrets_path,
)

END_PEPPER_WINDOW = "end-pepper-window"
SECRETS = {"secret-key": "secret_key", "jwt-signing-key": "jwt_signing_key", "api-key-pepper": "api_key_pepper"}
ENDS = {
    "secret_key": "dashboard sessions end (everyone signs in again); API keys and tokens keep working",
    "jwt_signing_key": "every access token is refused; clients log in again with their API key "
                       "(kernle: `kernle auth login`); API keys keep working",
    "api_key_pepper": "nothing ends: the old pepper stays accepted, and each key is re-hashed under the new one "
                      "on its next use; end the window later with `rotate_secret end-pepper-window`",
}


class Command(BaseCommand):
    help = "Rotate SECRET_KEY, the JWT signing key or the API-key pepper kept in the data dir (docs/operations.md §4)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("what", choices=[*SECRETS, END_PEPPER_WINDOW])
        parser.add_argument("--force", action="store_true",
                            help="end-pepper-window: drop the previous peppers although some keys were not used since")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["what"] == END_PEPPER_WINDOW:
            self._end_pepper_window(force=options["force"])
            return
        name = SECRETS[options["what"]]
        self._ensure_kept_in_file(name)
        rotate_kept_secret(settings.DATA_DIR, name)
        self.stdout.write(f"{VARIABLES[name]} rotated in {secrets_path(settings.DATA_DIR)}. Restart the service "
                          f"(web, worker, beat) to use it. Then {ENDS[name]}.")

    def _ensure_kept_in_file(self, name: str) -> None:
        variable = VARIABLES[name]
        if (os.environ.get(variable) or "").strip():
            raise CommandError(f"{variable} is set in the environment, so the file's value is not used: rotate it "
                               "there (docs/operations.md §4).")

    def _end_pepper_window(self, *, force: bool) -> None:
        self._ensure_kept_in_file("api_key_pepper")
        rotated_at = pepper_rotated_at(settings.DATA_DIR)
        waiting = keys_maybe_under_previous_pepper(rotated_at) if rotated_at is not None else None
        if waiting is not None and waiting.exists() and not force:
            ids = ", ".join(waiting.order_by("created_at").values_list("public_id", flat=True)[:20])
            raise CommandError(f"{waiting.count()} active key(s) have not been used since the pepper was rotated "
                               f"({rotated_at:%Y-%m-%d %H:%M} UTC) and would stop working: {ids}. Wait, revoke "
                               "them, or pass --force.")
        dropped = drop_previous_peppers(settings.DATA_DIR)
        self.stdout.write(f"Dropped {dropped} previous pepper(s). Restart the service to stop accepting them.")
