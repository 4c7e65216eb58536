"""Who wrote or was served a memory: the credential, the agent label and the path (docs/privacy.md
"Provenance" and "Access log").

An `Author` is built once per request (or job) from the `Principal` and stored as JSON on each
memory written (`Memory.written_by`), each revision (`MemoryRevision.author`) and each access-log
row (`MemoryAccess.author`). It never holds a secret: a key is named by its id and name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accounts.principal import Principal
from memoryhub.errors import InvalidInput


class Path:
    """How a write or a read reached the stack."""

    KERNLE = "kernle"  # the kernle protocol (push, pull, load, search under /api/v1/… kernle routes)
    API = "api"  # the native REST API
    MCP = "mcp"
    DASHBOARD = "dashboard"
    JOB = "job"  # a Celery job: decay, promotion, TTL, smart ingest's follow-ups


AGENT_HEADER = "X-Agent-Id"
AGENT_LABEL_MAX = 100


@dataclass(frozen=True)
class Author:
    path: str
    key_id: str = ""
    key_name: str = ""
    user_id: int | None = None
    user: str = ""  # the signed-in person's (or the key issuer's) e-mail
    agent: str = ""

    def as_json(self) -> dict[str, Any]:
        """The stored form; empty members left out."""
        return {name: value for name, value in (
            ("path", self.path), ("key_id", self.key_id), ("key_name", self.key_name),
            ("user_id", self.user_id), ("user", self.user), ("agent", self.agent)) if value not in ("", None)}


def agent_label(raw: Any, *, field: str = AGENT_HEADER) -> str:
    """An agent label as sent (a header or the MCP client's name), stripped; "" when absent.
    More than AGENT_LABEL_MAX characters, control characters or a non-string: 400 `invalid`."""
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise InvalidInput("The agent label must be text.", fields={field: ["Must be a string."]})
    label = raw.strip()
    if len(label) > AGENT_LABEL_MAX:
        raise InvalidInput("The agent label is too long.", fields={field: [f"At most {AGENT_LABEL_MAX} characters."]})
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in label):
        raise InvalidInput("The agent label has control characters.", fields={field: ["No control characters."]})
    return label


def author_of(principal: Principal, *, path: str, agent: str = "") -> Author:
    """The author of a write (or reader of a read) made with `principal` through `path`."""
    key = principal.api_key
    if key is not None:
        return Author(path=path, key_id=key.public_id, key_name=key.name, user_id=principal.user.pk,
                      user=principal.user.email, agent=agent)
    return Author(path=path, user_id=principal.user.pk, user=principal.user.email, agent=agent)


def job_author(job: str) -> Author:
    """The author of a server job's change (decay, TTL, promotion…): no credential, the job's name."""
    return Author(path=Path.JOB, agent=job)


def request_author(request: Any, principal: Principal, *, path: str) -> Author:
    """The author of a REST request: `principal`, the `X-Agent-Id` header's label (validated by
    `agent_label`: a bad one is a 400), and `path` (Path.KERNLE or Path.API)."""
    return author_of(principal, path=path, agent=agent_label(request.headers.get(AGENT_HEADER)))
