"""The write kernel's gate: may memory content be written to this stack now? (docs/consent.md)

Two states of the stack refuse writes of memory content by agents and API callers, on every path
(native API, smart ingest, native and kernle pushes, MCP, checkpoints, boot config), because they
are asked here, in the kernel, and nowhere else:

* `consent_required` — the school requires a guardian's consent (`Organization.consent_required`)
  and none is in force (`Stack.consent_given_at` is None: never given, or withdrawn);
* `memory_paused` — a guardian or an admin paused the student's memory (`Stack.paused_at`).

The decision reads only the stack row and its school, which the access decision already loaded
(and a push locked): no query is added to a write. The server's own work — decay, TTL, embeddings,
erasure, redaction, and staff forgetting or deleting — is not a write of new content and never
asks; `SERVER_SOURCES` names the server jobs that create content through the services (promotion's
nightly job) so they keep running. Reads are never gated.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoryhub.errors import Forbidden
from stacks.models import Stack

CONSENT_REQUIRED = "consent_required"
MEMORY_PAUSED = "memory_paused"

# Writers that are the server's own job, not an agent's or an API caller's: never refused here.
# "import" is the operator's `import_archive` (a stack restored from its archive, by the command line).
SERVER_SOURCES = frozenset({"promotion", "decay", "ttl", "embedding", "erasure", "redaction", "feedback",
                            "recall", "dashboard", "seed", "import"})


@dataclass(frozen=True)
class WriteRefusal:
    """Why the stack takes no memory content now: the error code and a message for the caller."""

    code: str
    message: str

    def error(self) -> Forbidden:
        return Forbidden(self.message, code=self.code)

    @property
    def conflict(self) -> str:
        """An operation's conflict text: a kernle conflict carries only text, so it names the code."""
        return f"{self.message} ({self.code})"


_CONSENT = WriteRefusal(CONSENT_REQUIRED, "The school requires a guardian's consent before this student's memory "
                                          "is written, and none is in force; nothing was stored.")
_PAUSED = WriteRefusal(MEMORY_PAUSED, "This student's memory is paused; nothing was stored. "
                                      "Reads go on; writes resume when it is resumed.")


def write_refusal(stack: Stack, *, source: str = "api") -> WriteRefusal | None:
    """The refusal of a write of memory content by `source` to `stack`, or None when it may be written.

    Reads `stack.organization` (loaded with the stack by stacks.selectors) and the stack's own
    columns as the caller read them; a push reads them under its FOR UPDATE lock, so a pause or a
    withdrawal committed before the push is seen by it."""
    if source in SERVER_SOURCES:
        return None
    if stack.organization.consent_required and stack.consent_given_at is None:
        return _CONSENT
    if stack.paused_at is not None:
        return _PAUSED
    return None


def ensure_accepting_writes(stack: Stack, *, source: str = "api") -> None:
    """Raise Forbidden (403, `consent_required` or `memory_paused`) when `write_refusal` refuses."""
    refusal = write_refusal(stack, source=source)
    if refusal is not None:
        raise refusal.error()
