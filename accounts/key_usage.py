"""What `create_school --issue-key`, `issue_key` and the dashboard's key page show about a new API
key: the secret, once, and the exact lines that use it.

The secret goes to the command's stdout only — never to a log: MemoryHub stores an HMAC of it
(docs/kernle-protocol.md §2.1), so this output is the only copy there will ever be.
"""

from __future__ import annotations

import os
from argparse import ArgumentParser
from typing import Any

from django.conf import settings

from accounts.models import ApiKey


def add_url_argument(parser: ArgumentParser) -> None:
    parser.add_argument("--url", default=None,
                        help="The service's address, for the printed lines (default: the running `make run`'s, "
                             "else http://127.0.0.1:$PORT)")


def service_url(option: str | None) -> str:
    """Where the service answers: `--url`, else what the running `make run` recorded, else HOST/PORT as
    `make run` reads them (a wildcard host is shown as 127.0.0.1, which the kernle CLI accepts)."""
    if option:
        return option.rstrip("/")
    running: dict[str, Any] = getattr(settings, "RUNNING_SERVICE", None) or {}
    if running.get("web_url"):
        return str(running["web_url"]).rstrip("/")
    host = os.environ.get("HOST", "").strip() or "127.0.0.1"
    if host in ("0.0.0.0", "::"):  # noqa: S104 - display only
        host = "127.0.0.1"
    port = os.environ.get("PORT", "").strip() or "8000"
    return f"http://{host}:{port}"


def key_usage_lines(key: ApiKey, secret: str, *, url: str) -> list[str]:
    scope = f"bound to stack {key.stack.slug}" if key.stack_id and key.stack else "school-wide (every stack)"
    flags = ["read-only" if key.read_only else "read-write",
             f"expires {key.expires_at:%Y-%m-%d %H:%M} UTC" if key.expires_at else "does not expire"]
    lines = [
        f"API key {key.public_id} for {key.user.email or key.user.username}: {scope}; {', '.join(flags)}.",
        "The secret is shown only now (MemoryHub keeps a hash of it). Use it:",
        f"  export MEMORYHUB_URL={url} MEMORYHUB_KEY={secret}",
    ]
    if key.stack_id and key.stack:
        slug = key.stack.slug
        lines += [
            f'  curl -s "$MEMORYHUB_URL/api/v1/stacks/{slug}/load" -H "Authorization: Bearer $MEMORYHUB_KEY"',
            f"  export KERNLE_STACK_ID={slug}    # the kernle CLI, then:",
        ]
    else:
        lines += [
            '  curl -s "$MEMORYHUB_URL/api/v1/stacks/" -H "Authorization: Bearer $MEMORYHUB_KEY"',
            "  export KERNLE_STACK_ID=<a stack of the school>    # the kernle CLI, then:",
        ]
    lines.append('  kernle auth login --api-key "$MEMORYHUB_KEY" --backend-url "$MEMORYHUB_URL"')
    return lines
