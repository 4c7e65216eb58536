"""Session memory cards (docs/algorithms.md §12): a session in, an episode and its card out.

Deterministic and offline: the same session gives the same card, no model is asked. The order is
the privacy gate's — **redact first, then derive**:

1. `session_allowlisted` keeps only the allowlisted fields (`SESSION_FIELDS`; `session_id`
   required; Lumera's control flags taken out of `metadata`, §12.4) — nothing else reaches a
   derivation, so no dropped field can leak into the card the way `error_message` and `output`
   did in the system this follows;
2. `session_redacted` runs the school's redaction over every value (`memories.privacy.redaction`): a
   CRITICAL secret refuses the session (422 `redaction_refused`), everything else becomes a
   `<REDACTED:RULE>` placeholder, and the report counts rules, never values;
3. `memory_card` derives the card only from that redacted text: title, 3-7 bullets, decisions,
   to-dos, entities, keywords, quotes. Placeholders are never taken for words, entities or quotes.

`session_store` then writes the episode (the redacted session) and a `session_card` note holding
the card (its text searchable, the card itself under `extra.memory_card`, `derived_from` the
episode) in one all-or-nothing batch through the memory services, so the write kernel redacts,
counts quota, stamps changes and embeds both like any other memory. A session id is stored once
per stack (its episode's record id): sending it again is a 409.

Fixed defects of the original heuristics: sentences end only at `.`, `!` or `?` followed by
whitespace or the end, so "roll back to v2.3.1" stays whole; tags are compared exactly (after
trimming), never as substrings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from accounts.authors import Author
from memories.models import Memory
from memories.privacy.grants import Audience, grants_filter
from memories.privacy.redaction.engine import redact_value, report_of
from memories.privacy.redaction.policy import RedactionPolicy
from memories.services import memory_batch_create
from memoryhub.errors import InvalidInput
from stacks.models import Stack

SESSION_FIELDS = ("session_id", "timestamp", "tool_name", "success", "summary", "tags", "schema_version",
                  "metadata")
# Lumera's control flags, read from `metadata` and never stored with it: a dry run, and the two-key
# opt-in to keeping the session itself, not only its card (docs/algorithms.md §12.4).
DRY_RUN, ALLOW_RAW_EXPORT, RAW_EXPORT_ACK = "dry_run", "allow_raw_export", "raw_export_ack"
RAW_EXPORT_PHRASE = "I understand the risk"  # exactly: case and spaces count
SESSION_MODES = frozenset({"mock", "live"})  # Lumera's storage backends; here MemoryHub is the store
SUMMARY_MAX = 20_000  # the episode's outcome holds it (memories.records.vocabulary.LONG)
SESSION_ID_MAX = 100
CARD_NOTE_TYPE = "session_card"
SESSION_TAG = "session"

TITLE_MAX = 60
BULLETS_MIN, BULLETS_MAX = 3, 7
DECISIONS_MAX, TODOS_MAX, ENTITIES_MAX, KEYWORDS_MAX, QUOTES_MAX = 5, 7, 15, 20, 5
PHRASE_MIN, PHRASE_MAX = 10, 100  # a decision's or a to-do's length
QUOTE_MIN, QUOTE_MAX = 10, 160

_PLACEHOLDER = re.compile(r"<REDACTED:[A-Z0-9_]+>")
# A sentence ends at . ! or ? followed by whitespace or the end — never inside "v2.3.1" or "e.g.x".
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TRAILING = re.compile(r"[\s.!?,;:]+$")
_DECISION = re.compile(r"\b(?:decided(?:\s+to)?|chose(?:\s+to)?|selected|picked(?:\s+to)?|will|going\s+to|"
                       r"approved|rejected|accepted)\s+(.+)", re.IGNORECASE)
_TODO = re.compile(r"(?:\bTODO\b:?|\bFIXME\b:?|\bACTION:|\bnext\s+steps?\s*:|\baction\s+items?\s*:|"
                   r"\bneed\s+to\b|\bmust\b|\bshould\b)\s*(.+)", re.IGNORECASE)
_MULTIWORD = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b")
_CAPITALISED = re.compile(r"\b[A-Z][a-zA-Z]{3,}\b")
_WORD = re.compile(r"[a-z][a-z0-9'-]{2,}")
_QUOTE = re.compile(rf"\"([^\"]{{{QUOTE_MIN},{QUOTE_MAX}}})\"|\u201c([^\u201d]{{{QUOTE_MIN},{QUOTE_MAX}}})\u201d")

_STOPWORDS_TEXT = """
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers herself him himself his how i if in into is it its itself just let me more most my myself no nor not now
of off on once only or other our ours ourselves out over own same she should so some such than that the their
theirs them themselves then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours yourself yourselves session tool today
yesterday tomorrow one two get got make made use used
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
# Capitalised words that start sentences or name nothing: never entities on their own.
_NOT_ENTITIES = frozenset({"This", "That", "These", "Those", "There", "Then", "When", "What", "Which", "While",
                           "With", "Will", "After", "Before", "Also", "Next", "Need", "Must", "Should",
                           "Decided", "Chose", "Selected", "Picked", "Approved", "Rejected", "Accepted",
                           "Investigated", "Today", "Tomorrow", "Yesterday", "TODO", "FIXME", "ACTION",
                           "Session", "Tool", "Tags", "Time", "REDACTED"})


@dataclass(frozen=True)
class PreparedSession:
    session: dict[str, Any]  # allowlisted, redacted
    redaction: list[dict[str, Any]]  # [{"rule", "count"}]
    card: dict[str, Any]


# --- 1. allowlist ----------------------------------------------------------------------------------


def _clean_tags(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value) or len(value) > 50:
        raise InvalidInput("Invalid tags.", fields={"tags": ["A list of at most 50 strings."]})
    tags: list[str] = []
    for tag in value:
        tag = tag.strip()
        if tag and len(tag) <= 100 and tag not in tags:  # exact comparison, never a substring
            tags.append(tag)
    return tags


def session_allowlisted(body: dict[str, Any]) -> dict[str, Any]:
    """The session's allowlisted fields, validated. Anything else was refused by the request
    serializer already; this is the guard for callers that skip it (services, MCP)."""
    session = {name: body[name] for name in SESSION_FIELDS if body.get(name) is not None}
    session_id = session.get("session_id")
    if not isinstance(session_id, str) or not session_id.strip() or len(session_id) > SESSION_ID_MAX \
            or not session_id.isprintable():
        raise InvalidInput("A session needs a session_id.",
                           fields={"session_id": [f"Required: 1-{SESSION_ID_MAX} printable characters."]})
    session["session_id"] = session_id.strip()
    summary = session.get("summary", "")
    # Optional: Lumera sends a session by its id, tags and metadata alone; its card is made from those.
    if not isinstance(summary, str) or len(summary) > SUMMARY_MAX:
        raise InvalidInput("Invalid summary.",
                           fields={"summary": [f"The transcript or summary, at most {SUMMARY_MAX} characters."]})
    session["summary"] = summary.strip()
    session["tags"] = _clean_tags(session.get("tags"))
    for name in ("timestamp", "tool_name", "schema_version"):
        if name in session and (not isinstance(session[name], str) or len(session[name]) > 200):
            raise InvalidInput(f"Invalid {name}.", fields={name: ["A string of at most 200 characters."]})
    if "success" in session and not isinstance(session["success"], bool):
        raise InvalidInput("Invalid success.", fields={"success": ["Must be true or false."]})
    if "metadata" in session and not isinstance(session["metadata"], dict):
        raise InvalidInput("Invalid metadata.", fields={"metadata": ["Must be an object."]})
    if "metadata" in session:
        session["metadata"] = {key: value for key, value in session["metadata"].items()
                               if key not in (DRY_RUN, ALLOW_RAW_EXPORT, RAW_EXPORT_ACK)}
        if not session["metadata"]:
            del session["metadata"]
    return session


@dataclass(frozen=True)
class SessionOptions:
    dry_run: bool
    raw_export: bool  # the two-key opt-in was given (docs/algorithms.md §12.4)


def session_options(body: dict[str, Any]) -> SessionOptions:
    """The control flags of a session body: `dry_run` (top level or in `metadata`) and Lumera's
    raw-export opt-in, `metadata.allow_raw_export` true with `metadata.raw_export_ack` exactly
    RAW_EXPORT_PHRASE. An opt-in without the exact acknowledgement is refused (400, nothing stored)
    rather than quietly downgraded: the caller asked for something it did not get."""
    given = body.get("metadata")
    metadata: dict[str, Any] = given if isinstance(given, dict) else {}
    for name in (DRY_RUN, ALLOW_RAW_EXPORT):
        if name in metadata and not isinstance(metadata[name], bool):
            raise InvalidInput(f"Invalid metadata.{name}.", fields={f"metadata.{name}": ["Must be true or false."]})
    raw_export = metadata.get(ALLOW_RAW_EXPORT) is True
    if raw_export and metadata.get(RAW_EXPORT_ACK) != RAW_EXPORT_PHRASE:
        raise InvalidInput(f"A raw export needs metadata.raw_export_ack to be exactly {RAW_EXPORT_PHRASE!r}.",
                           code="raw_export_not_acknowledged",
                           fields={f"metadata.{RAW_EXPORT_ACK}": [f"Must be exactly {RAW_EXPORT_PHRASE!r}."]})
    mode = body.get("mode")
    if mode is not None and mode not in SESSION_MODES:
        raise InvalidInput("Invalid mode.", fields={"mode": ["One of: live, mock."]})
    return SessionOptions(dry_run=body.get(DRY_RUN) is True or metadata.get(DRY_RUN) is True,
                          raw_export=raw_export)


# --- 2. redaction ------------------------------------------------------------------------------------


def session_redacted(session: dict[str, Any], policy: RedactionPolicy) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every value of the allowlisted session redacted under the school's policy, and the report."""
    counts: Counter[str] = Counter()
    redacted = redact_value(session, field="session", counts=counts, policy=policy)
    return redacted, report_of(counts)


# --- 3. the card ------------------------------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]


def _phrase(match_text: str) -> str | None:
    phrase = _TRAILING.sub("", match_text.strip())
    return phrase if PHRASE_MIN <= len(phrase) <= PHRASE_MAX else None


def _first(items: Iterable[str | None], limit: int) -> list[str]:
    chosen: list[str] = []
    for item in items:
        if item and item not in chosen:
            chosen.append(item)
            if len(chosen) == limit:
                break
    return chosen


def _title(session: dict[str, Any], sentences: list[str]) -> str:
    if sentences:
        first = _TRAILING.sub("", sentences[0])
        if len(first) < TITLE_MAX:
            return first
        cut = sentences[0][:TITLE_MAX]
        if " " in cut:
            cut = cut.rsplit(" ", 1)[0]
        return _TRAILING.sub("", cut) + "…"
    if session.get("tool_name"):
        return f"{session['tool_name']}: {session['session_id']}"
    return f"Session {session['session_id']}"


def _bullets(session: dict[str, Any], sentences: list[str]) -> list[str]:
    bullets: list[str] = []
    if session.get("tool_name"):
        outcome = (" (succeeded)" if session["success"] else " (failed)") if "success" in session else ""
        bullets.append(f"Tool: {session['tool_name']}{outcome}")
    bullets.extend([s for s in sentences if len(s) > 10][:3])
    if session["tags"]:
        bullets.append("Tags: " + ", ".join(session["tags"][:5]))
    for padding in (f"Session: {session['session_id']}",
                    f"Time: {session['timestamp']}" if session.get("timestamp") else None):
        if len(bullets) >= BULLETS_MIN:
            break
        if padding:
            bullets.append(padding)
    return bullets[:BULLETS_MAX]


def _entities(text: str, sentences: list[str]) -> list[str]:
    starts = {s.split(" ", 1)[0] for s in sentences}
    multi = _first((m.group(0) for m in _MULTIWORD.finditer(text)
                    if m.group(0).split(" ", 1)[0] not in _NOT_ENTITIES), 5)
    inside = {word for phrase in multi for word in phrase.split()}
    single = _first((m.group(0) for m in _CAPITALISED.finditer(text)
                     if m.group(0) not in _NOT_ENTITIES and m.group(0) not in inside
                     and (m.group(0) not in starts or text.count(m.group(0)) > 1)), 5)
    return (multi + single)[:ENTITIES_MAX]


def _keywords(text: str) -> list[str]:
    words = [w.strip("'-") for w in _WORD.findall(text.lower())]
    counts = Counter(w for w in words if len(w) >= 3 and w not in STOPWORDS)
    first_seen = {w: i for i, w in reversed(list(enumerate(words)))}
    return sorted(counts, key=lambda w: (-counts[w], first_seen[w]))[:KEYWORDS_MAX]


def memory_card(session: dict[str, Any]) -> dict[str, Any]:
    """The card of an allowlisted, **redacted** session (docs/algorithms.md §12). Pure and
    deterministic: the same session gives the same card."""
    summary = session["summary"]
    sentences = _sentences(summary)
    analysed = " ".join(part for part in (summary, session.get("tool_name") or "") if part)
    words_only = _PLACEHOLDER.sub(" ", analysed)  # a placeholder is no word, entity or keyword
    return {
        "title": _title(session, sentences),
        "summary_bullets": _bullets(session, sentences),
        "decisions": _first((_phrase(m.group(1)) for s in sentences for m in [_DECISION.search(s)] if m),
                            DECISIONS_MAX),
        "todos": _first((_phrase(m.group(1)) for s in sentences for m in [_TODO.search(s)] if m), TODOS_MAX),
        "entities": _entities(words_only, _sentences(words_only)),
        "keywords": _keywords(words_only),
        "notable_quotes": _first(((m.group(1) or m.group(2)).strip() for m in _QUOTE.finditer(summary)), QUOTES_MAX),
        "tags": list(session["tags"]),
    }


def card_text(card: dict[str, Any]) -> str:
    """The card as the note's searchable content."""
    lines = [card["title"], *(f"- {b}" for b in card["summary_bullets"])]
    for label, name in (("Decisions", "decisions"), ("To do", "todos"), ("Quotes", "notable_quotes")):
        if card[name]:
            lines.append(f"{label}: " + "; ".join(card[name]))
    for label, name in (("Entities", "entities"), ("Keywords", "keywords")):
        if card[name]:
            lines.append(f"{label}: " + ", ".join(card[name]))
    return "\n".join(lines)


def session_prepare(body: dict[str, Any], policy: RedactionPolicy) -> PreparedSession:
    """Allowlist, redact, derive: everything a dry run shows and a store writes."""
    session, report = session_redacted(session_allowlisted(body), policy)
    return PreparedSession(session=session, redaction=report, card=memory_card(session))


# --- reading -----------------------------------------------------------------------------------------


def session_cards(stack: Stack, *, audience: Audience | None, limit: int = 5) -> list[dict[str, Any]]:
    """The stack's newest session cards a viewer may see (the privacy grants of `audience`, as for
    every other memory read): `{"card", "created_at", "memory_id"}`. One indexed query."""
    notes = grants_filter(Memory.objects.filter(stack_id=stack.pk, kind="note", deleted_at__isnull=True,
                                                forgotten_at__isnull=True, data__note_type=CARD_NOTE_TYPE),
                          audience)
    rows = notes.order_by("-created_at", "-id").values("id", "created_at", "extra")[:limit]
    return [{"card": row["extra"].get("memory_card") or {}, "created_at": row["created_at"], "memory_id": row["id"]}
            for row in rows if isinstance(row["extra"], dict)]


# --- storing ----------------------------------------------------------------------------------------


def episode_record_id(session_id: str) -> str:
    return f"session:{session_id}"


def session_store(*, stack: Stack, prepared: PreparedSession, source: str = "api",
                  author: Author | None = None) -> tuple[Memory, Memory]:
    """Write the episode and its card note, all or nothing (memory_batch_create), as `author`. The
    caller resolved `stack` with write access."""
    session, card = prepared.session, prepared.card
    episode_id = episode_record_id(session["session_id"])
    context = {name: session[name] for name in ("session_id", "tool_name", "timestamp", "schema_version", "metadata")
               if name in session}
    outcome_type = ("success" if session["success"] else "failure") if "success" in session else None
    episode = {"kind": "episode", "record_id": episode_id, "objective": card["title"],
               "outcome": session["summary"] or card["title"], "outcome_type": outcome_type,
               "tags": _first([SESSION_TAG, *session["tags"]], 50), "session": context}
    note = {"kind": "note", "record_id": f"session-card:{session['session_id']}", "note_type": CARD_NOTE_TYPE,
            "content": card_text(card), "derived_from": [f"episode:{episode_id}"],
            "tags": _first([SESSION_TAG, *session["tags"]], 50), "memory_card": card,
            "session": {"session_id": session["session_id"]}}
    stored = memory_batch_create(stack=stack, items=[episode, note], source=source, author=author)
    return stored[0], stored[1]
