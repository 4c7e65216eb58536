"""Budget-aware load: what matters most in a stack, within a token budget.

Pinned algorithm (docs/algorithms.md §8, Kernle's original 60/40 formula plus the 0.15 strength
tiers — chosen because its test vectors are published and it needs no clock):

* budget: default 8000 tokens, 100-50000 (the API refuses others: memories.serializers.memories.LoadQuerySerializer);
* tokens(text) = ceil(floor(len(text) / 4) x 1.3) — the same estimate for everything;
* order of reservation: the latest checkpoint (always first, truncated to fit the budget), then
  boot config (key order), then memories by priority;
* priority = (0.6·base + 0.4·factor), halved when strength < 0.8 ("fading"); memories with
  strength < 0.5 (weak/dormant/forgotten) are not loaded. Bases: value 0.90, belief 0.70,
  goal 0.65, drive 0.60, episode 0.40, note 0.35, relationship 0.30. Factors: value priority/100,
  belief confidence, drive intensity, relationship (sentiment+1)/2, goal/episode/note 0.7.
  Ties: kind order (values, beliefs, goals, drives, episodes, notes, relationships), then newest.
  Test vectors: value priority 80 → 0.86; belief confidence 0.9 → 0.78; drive intensity 0.7 → 0.64;
  goal 0.67; episode 0.52; note 0.49; relationship sentiment 0 → 0.38;
* candidates: up to 1000 newest per kind; goals only while active, beliefs only while active and
  not superseded; forgotten, deleted and expired memories never; kernle checkpoint episodes never
  (their checkpoint is first already: docs/kernle-protocol.md §3.12);
* each item's text is cut to `item_chars` (default 500) at a word boundary; the walk is greedy
  (an item that does not fit is skipped, later smaller ones may still fit);
* up to 20 excluded candidates come back as "echoes" (8-word hints), so an agent knows what it
  could search for;
* the loaded memories' `times_accessed` / `last_accessed` move in ONE UPDATE (no version or change
  feed bump: access is bookkeeping, not an edit a device must pull), at most once per memory per
  ACCESS_RESOLUTION_SECONDS (loads closer together are one use: docs/algorithms.md §3.1).

Speed: candidates are scored, ordered and summed in SQL (one index walk per kind, a score
expression per kind so constant-factor kinds never read `data`); only the rows the walk can take
leave the database, those that fit whole and the echo window with the head of their text and the
few detail fields (never the whole `data`). Two round trips, the checkpoint with the boot config and
settings + candidates; a third only for the rest: the access UPDATE when a chosen memory has a use
to count (the candidates say which), and the rows the walk took past the window. The last two are
each one query string that PostgreSQL runs as an implicit transaction (no BEGIN / COMMIT round
trips), the UPDATE's committed without waiting for the WAL flush when the load is not inside a
caller's transaction (bench/load.py). The candidates statement is prepared once per database
session, with one generic plan (docs/algorithms.md §8.4).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from memories.privacy.grants import Audience, grants_sql
from memories.records.vocabulary import CHECKPOINT_EPISODE_TAGS, CHECKPOINT_OBJECTIVE_PREFIX
from memories.selectors import checkpoint_context_text, checkpoint_warnings, working_state
from memoryhub.database import async_commit_sql, skip_to_rows, uuid_array
from memoryhub.prepared import fetch_prepared
from stacks.models import Stack

DEFAULT_BUDGET = 8000
MIN_BUDGET = 100
MAX_BUDGET = 50000
DEFAULT_ITEM_CHARS = 500
MIN_ITEM_CHARS = 10
MAX_ITEM_CHARS = 10000
CANDIDATES_PER_KIND = 1000
ECHO_LIMIT = 20
ECHO_WORDS = 8
LOAD_MIN_STRENGTH = 0.5
FADING_STRENGTH = 0.8
CANDIDATE_RANDOM_PAGE_COST = 1.1
# The candidates statements' prepared names start so (memoryhub.prepared).
PREPARED_NAME = "memoryhub_load"
# The prepared statement's one plan serves every stack, so it must be the walk of the (stack, kind,
# created_at) index per kind, stopped by the limit. Planned for an average stack, a table of many
# small stacks would get bitmap scans instead, which read and sort a large stack's whole kind.
_ONE_PLAN_SQL = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; "
# Loads of one memory less than this apart count as one access (docs/algorithms.md §3.1): an agent
# that reloads its memory every turn of a conversation is using it once, not fifty times, and the
# access factor of salience is meant to reward use spread over time. It also bounds the cost: each
# counted access rewrites the row (a new row version; when it cannot stay on its page, an entry in
# every index, the HNSW graph included). Under bench/soak.py, where every stack is loaded about
# every 10 s, counting every load made these UPDATEs as much of PostgreSQL's time as storing the
# embeddings. Like an API key's `last_used_at` (accounts.authentication), so
# `last_accessed` is exact to within this.
ACCESS_RESOLUTION_SECONDS = 600

LOAD_KINDS = ("value", "belief", "goal", "drive", "episode", "note", "relationship")
BASE_PRIORITY = {"value": 0.90, "belief": 0.70, "goal": 0.65, "drive": 0.60, "episode": 0.40,
                 "note": 0.35, "relationship": 0.30}
RECENCY_FACTOR = 0.7


def clamp_budget(budget: int | None) -> int:
    """The budget a load uses. Requests are refused outside MIN_BUDGET-MAX_BUDGET before they get
    here (400 naming `budget`); in-process callers are held to the same range."""
    if budget is None:
        return DEFAULT_BUDGET
    return max(MIN_BUDGET, min(MAX_BUDGET, budget))


def clamp_item_chars(chars: int | None) -> int:
    if chars is None:
        return DEFAULT_ITEM_CHARS
    return max(MIN_ITEM_CHARS, min(MAX_ITEM_CHARS, chars))


def estimate_tokens(text: str) -> int:
    return token_estimate_for_length(len(text))


def token_estimate_for_length(length: int) -> int:
    return math.ceil((length // 4) * 1.3)


def truncate_at_word(text: str, max_chars: int) -> str:
    """Cut to at most `max_chars` characters at a word boundary, ending in "..."."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 3:
        return text[:max_chars]
    cut = text[: max_chars - 3]
    space = cut.rfind(" ")
    if space > len(cut) // 2:
        cut = cut[:space]
    return cut.rstrip() + "..."


def priority_score(kind: str, *, factor: float, strength: float = 1.0) -> float:
    """The pinned 60/40 score (see module docstring); the SQL below computes the same."""
    score = 0.6 * BASE_PRIORITY[kind] + 0.4 * factor
    return score * 0.5 if strength < FADING_STRENGTH else score


# Only module constants are formatted in; every value from a request is a bound parameter.
# One index walk per kind scores every candidate; window functions order them (score,
# kind order, newest) and add up their token bounds, so only the rows the greedy walk can take
# leave the database: the prefix that fits whole, the next 2 x ECHO_LIMIT rows (echo material) and
# any later row small enough for what the prefix leaves. The first two come with what a load
# returns of them, read by the row's address (ctid) as the index walk found it: within one
# statement that is the same row version, and no second lookup of each id by its key.
def _json_number(key: str, default: float, low: float, high: float) -> str:
    return (f"LEAST(GREATEST(CASE WHEN jsonb_typeof(data->'{key}') = 'number' "
            f"THEN (data->>'{key}')::float8 ELSE {default} END, {low}), {high})")


# One score expression per kind (the branch's kind is a literal), so kinds whose factor is a
# constant (goal, episode, note) never read — and never decompress — the `data` JSON.
_FACTOR_SQL = {
    "value": f"{_json_number('priority', 50, 0, 100)} / 100.0",
    "belief": "confidence",
    "goal": str(RECENCY_FACTOR),
    "drive": _json_number("intensity", 0.5, 0, 1),
    "episode": str(RECENCY_FACTOR),
    "note": str(RECENCY_FACTOR),
    "relationship": f"({_json_number('sentiment', 0, -1, 1)} + 1) / 2.0",
}


def _score_sql(kind: str) -> str:
    return (f"(({0.6 * BASE_PRIORITY[kind]:.4f} + 0.4 * ({_FACTOR_SQL[kind]}))"
            f" * (CASE WHEN strength < {FADING_STRENGTH} THEN 0.5 ELSE 1.0 END))::float8")


# Written as NOT(<containment>) so the planner estimates "almost every row passes" and keeps
# walking the (stack, kind, -created_at) index instead of sorting the stack (a plain equality on a
# JSON field is estimated at 0.5% selectivity, which flips the plan).
# A kernle checkpoint episode (docs/kernle-protocol.md §3.12) is not an episode candidate: its
# checkpoint is loaded first already, and counting it twice would spend the budget twice.
_CHECKPOINT_EPISODE_SQL = (
    "AND NOT (tags @> ARRAY[" + ", ".join(f"'{tag}'" for tag in CHECKPOINT_EPISODE_TAGS) + "]::text[] "
    f"AND coalesce(data->>'objective', '') LIKE '{CHECKPOINT_OBJECTIVE_PREFIX}%%')")
# Whether a load now would count as a use of the memory (ACCESS_RESOLUTION_SECONDS). The candidates
# read it from the row they score anyway, so a load whose chosen memories were all counted lately
# sends no access UPDATE at all; the UPDATE checks it again on the rows it locks.
_UNCOUNTED_SQL = ("(last_accessed IS NULL OR last_accessed <= %(now)s::timestamptz "
                  "- make_interval(secs => %(resolution)s))")
_KIND_FILTER = {
    "episode": _CHECKPOINT_EPISODE_SQL,
    "goal": "AND NOT (data ? 'status' AND coalesce(data->>'status', 'active') <> 'active')",
    "belief": "AND NOT (data @> '{\"is_active\": false}') "
              "AND NOT (data ? 'superseded_by' AND coalesce(data->>'superseded_by', '') <> '')",
}


# Small kind-specific fields returned beside the text (structure, not content: counted under the
# 1.3 JSON overhead of the token estimate).
_ITEM_FIELDS = {
    "value": ("name", "priority"), "belief": ("belief_type",), "goal": ("status", "priority", "goal_type"),
    "drive": ("drive_type", "intensity"), "episode": ("outcome_type",), "note": ("note_type",),
    "relationship": ("entity_name", "entity_type", "sentiment"),
}


def _returned_columns_sql(table: str) -> str:
    """What a load returns of a memory row of `table`: record id, created at, the head of the text
    and the kind's detail fields as one jsonb (never the whole `data`)."""
    whens = []
    for kind, names in _ITEM_FIELDS.items():
        pairs = ", ".join(f"'{name}', {table}.data->'{name}'" for name in names)
        whens.append(f"WHEN '{kind}' THEN jsonb_build_object({pairs})")
    return (f"{table}.record_id, {table}.created_at, left({table}.text, %(head)s), "
            f"CASE {table}.kind {' '.join(whens)} END")


def _kind_candidates_sql(rank: int, kind: str, grants: str) -> str:
    # A literal kind per branch lets each branch walk the (stack, kind, -created_at) index and stop
    # after CANDIDATES_PER_KIND rows: no sort of the stack's rows, no scan of the other kinds.
    # `grants`: the privacy-grants predicate for a requester other than the stack's own credentials
    # (memories.privacy.grants), inside each branch and before its LIMIT; empty for the stack's own.
    return f"""(SELECT id, ctid AS tid, created_at, {rank} AS kind_rank, '{kind}'::text AS kind,
            {_score_sql(kind)} AS score, ceil(floor(LEAST(length(text), %(cap)s) / 4) * 1.3)::int AS bound,
            {_UNCOUNTED_SQL} AS uncounted
     FROM memories_memory
     WHERE stack_id = %(stack)s AND kind = '{kind}'
       AND deleted_at IS NULL AND forgotten_at IS NULL
       AND (expires_at IS NULL OR expires_at > %(now)s)
       AND strength >= {LOAD_MIN_STRENGTH} {_KIND_FILTER.get(kind, "")} {grants}
     ORDER BY created_at DESC
     LIMIT {CANDIDATES_PER_KIND})"""  # noqa: S608 (module constants only)


@cache
def _candidates_sql(grants: str = "") -> str:
    """The candidates query; `grants` is "" or "AND <grants predicate>" (two or three variants in all)."""
    return _CANDIDATES_SQL_TEMPLATE.replace("{scored}", " UNION ALL ".join(
        _kind_candidates_sql(rank, kind, grants) for rank, kind in enumerate(LOAD_KINDS)))


# The rows that fit whole and the echo window: the ones returned with their text.
_PREFIX_OR_WINDOW_SQL = f"(r.cum <= %(budget)s OR r.pos < p.first_out + {ECHO_LIMIT * 2})"
_CANDIDATES_SQL_TEMPLATE = f"""
WITH scored AS (
    {{scored}}
), ranked AS (
    SELECT id, tid, kind, score, bound, uncounted,
           row_number() OVER w AS pos,
           sum(bound) OVER w AS cum
    FROM scored
    WINDOW w AS (ORDER BY score DESC, kind_rank, created_at DESC, id ROWS UNBOUNDED PRECEDING)
), prefix AS (
    SELECT coalesce(max(cum) FILTER (WHERE cum <= %(budget)s), 0) AS used,
           coalesce(min(pos) FILTER (WHERE cum > %(budget)s), 0) AS first_out,
           count(*) AS total
    FROM ranked
)
SELECT r.id::text, r.kind, r.score, r.bound, r.uncounted, p.total, {_returned_columns_sql("m")}
FROM ranked r CROSS JOIN prefix p
     LEFT JOIN memories_memory m ON m.ctid = r.tid AND {_PREFIX_OR_WINDOW_SQL}
WHERE {_PREFIX_OR_WINDOW_SQL}
   OR r.bound <= %(budget)s - p.used
ORDER BY r.pos
"""  # noqa: S608


@dataclass
class LoadedItem:
    id: str
    kind: str
    record_id: str
    text: str
    score: float
    tokens: int
    truncated: bool
    created_at: datetime
    details: dict[str, Any]


@dataclass
class LoadResult:
    budget_total: int
    budget_used: int
    item_chars: int
    checkpoint: dict[str, Any] | None
    boot_config: dict[str, str]
    memories: list[LoadedItem]
    echoes: list[dict[str, Any]]
    excluded_count: int
    generated_at: datetime = field(default_factory=timezone.now)

    def served_ids(self) -> list[str]:
        """The ids of the memories this load shows, in full or as an echo's hint (the access log's)."""
        return [item.id for item in self.memories] + [echo["id"] for echo in self.echoes]

    def as_json(self) -> dict[str, Any]:
        """The wire form, the same on REST (`GET …/load`) and MCP (`memory_load`)."""
        return {
            "checkpoint": self.checkpoint,
            "boot_config": self.boot_config,
            "memories": [item.__dict__ for item in self.memories],
            "echoes": self.echoes,
            "meta": {"budget_total": self.budget_total, "budget_used": self.budget_used,
                     "excluded_count": self.excluded_count, "item_chars": self.item_chars},
            "generated_at": self.generated_at,
        }


# SKIP LOCKED: a row a writer holds right now (the embedder storing its vector, a push) is not
# counted this time rather than waited for. Waiting deadlocked: the embedder locks a batch's rows in
# its order, this UPDATE in another, and PostgreSQL cancelled one of them (a 503 for the agent, a
# failed embedding task) several times per `bench/soak.py --minutes 2` run.
# A row counted within ACCESS_RESOLUTION_SECONDS is neither locked nor rewritten.
_TOUCH_SQL = ("UPDATE memories_memory m SET times_accessed = m.times_accessed + 1, last_accessed = %(now)s "  # noqa: S608
              f"FROM (SELECT id FROM memories_memory WHERE id = ANY(%(chosen)s::uuid[]) AND {_UNCOUNTED_SQL} "
              "FOR NO KEY UPDATE SKIP LOCKED) free WHERE m.id = free.id; ")
_ROWS_SQL = f"""
SELECT id::text, kind, {_returned_columns_sql("memories_memory")}
FROM memories_memory
WHERE id = ANY(%(ids)s::uuid[])
"""  # noqa: S608 (module constants only)


def checkpoint_text(checkpoint: Any) -> str:
    parts = [f"Task: {checkpoint.task}"]
    if checkpoint.progress:
        parts.append(f"Progress: {checkpoint.progress}")
    if checkpoint.next_step:
        parts.append(f"Next: {checkpoint.next_step}")
    if checkpoint.blocker:
        parts.append(f"Blocker: {checkpoint.blocker}")
    if checkpoint.pending:
        parts.append("Pending: " + "; ".join(checkpoint.pending))
    if checkpoint.context:
        parts.append("Context: " + checkpoint_context_text(checkpoint))
    return "\n".join(parts)


def _chars_for_tokens(tokens: int) -> int:
    """The longest text whose estimate fits in `tokens`."""
    # floor(len/4)*1.3 <= tokens  <=>  floor(len/4) <= tokens/1.3
    quarter = math.floor(tokens / 1.3)
    while quarter > 0 and math.ceil(quarter * 1.3) > tokens:
        quarter -= 1
    return quarter * 4 + 3


def stack_load(*, stack: Stack, budget: int | None = None, item_chars: int | None = None,
               now: datetime | None = None, track_access: bool = True,
               audience: Audience | None = None) -> LoadResult:
    """Assemble the load for `stack` (see module docstring). `audience`: the requester when it is not
    the stack's own credentials (memories.privacy.grants): only memories its grants admit are candidates, and
    echoes come from those too. The checkpoint and boot config are the stack's working state, not
    memories, and carry no grants: whoever may read the stack gets them."""
    now = now or timezone.now()
    total = clamp_budget(budget)
    cap = clamp_item_chars(item_chars)
    remaining = total

    checkpoint_out: dict[str, Any] | None = None
    checkpoint, boot_config = working_state(stack=stack)
    if checkpoint is not None:
        full = checkpoint_text(checkpoint)
        text = truncate_at_word(full, _chars_for_tokens(remaining))
        tokens = estimate_tokens(text)
        remaining -= tokens
        checkpoint_out = {
            "id": checkpoint.pk, "task": checkpoint.task, "created_at": checkpoint.created_at,
            "saved_at": checkpoint.saved_at, "pending": list(checkpoint.pending),
            "text": text, "tokens": tokens, "truncated": text != full,
            "warnings": [{"code": w.code, "message": w.message} for w in checkpoint_warnings(checkpoint, now=now)],
        }

    boot: dict[str, str] = {}
    for key, value in boot_config:
        tokens = estimate_tokens(f"{key}: {value}")
        if tokens <= remaining:
            boot[key] = value
            remaining -= tokens

    # Only when this is the outermost transaction: a caller's own writes keep their durability.
    own_transaction = not connection.in_atomic_block
    # Outside a caller's transaction no BEGIN / COMMIT is sent (two round trips on every load): each
    # of the two round trips below is one query string of several statements, which PostgreSQL runs
    # as one implicit transaction, and SET LOCAL holds for that string only. Inside a caller's
    # transaction, a savepoint as before.
    scope = transaction.atomic() if not own_transaction else contextlib.nullcontext()
    with scope, connection.cursor() as cursor:
        # A stack's rows are hot in cache, so random heap access is cheap; at the default cost (4.0)
        # the planner prefers scanning the whole stack through the heap-ordered stack_id index and
        # sorting it, much slower on a large stack (docs/benchmarks.md "Figures behind code choices").
        # The only write here is the access bookkeeping, so the commit need not wait for the WAL
        # flush (the UPDATE's query string says so): a crash can lose at most the last few access
        # counts, never an edit. Both settings are scoped to their transaction (or query string).
        # Sent with the query in one round trip (client-side binding allows several statements).
        settings_sql = f"SET LOCAL random_page_cost = {CANDIDATE_RANDOM_PAGE_COST}; "
        grants, grant_params = grants_sql(audience, "memories_memory") if audience is not None else ("", {})
        candidates_sql = _candidates_sql(f"AND {grants}" if grants else "")
        params = {"cap": cap, "head": cap + 1, "stack": stack.pk, "now": now, "budget": max(remaining, 0),
                  "resolution": ACCESS_RESOLUTION_SECONDS, **grant_params}
        # Planning this statement costs more than running it on a small stack: prepared once per
        # session, with one generic plan for every stack (docs/algorithms.md §8.4). Only as its own
        # transaction: inside a caller's, the planner settings it is sent with would last until the
        # caller's commit.
        candidates = fetch_prepared(cursor, candidates_sql, params, name=PREPARED_NAME,
                                    settings_sql=settings_sql + _ONE_PLAN_SQL) if own_transaction else None
        if candidates is None:
            cursor.execute(settings_sql + candidates_sql, params)
            skip_to_rows(cursor)  # past the SET statements to the candidates
            candidates = cursor.fetchall()

        # The greedy walk, in priority order. Rows the query left out are ones that cannot fit.
        # Ids come as text: they only go back into SQL and out in JSON, never need a UUID object.
        # `bound` is the token estimate of the text cut to `cap` (truncation never lengthens).
        # The prefix and the echo window come with what is returned of them (`rows`); a later row
        # the walk takes, or an echo past the window, is read after the walk.
        chosen: list[tuple[str, float]] = []
        uncounted_ids: list[str] = []
        echoes: list[tuple[str, str, float]] = []
        rows: dict[str, tuple[Any, ...]] = {}
        for (memory_id, kind, score, bound, uncounted, _total,
             record_id, created_at, head, details_json) in candidates:
            if remaining > 0 and bound <= remaining:
                chosen.append((memory_id, score))
                remaining -= bound
                if uncounted:
                    uncounted_ids.append(memory_id)
            elif len(echoes) < ECHO_LIMIT:
                echoes.append((memory_id, kind, score))
            else:
                continue
            if head is not None:  # NULL outside the prefix and the echo window
                rows[memory_id] = (memory_id, kind, record_id, created_at, head, details_json)
        excluded = (candidates[0][5] - len(chosen)) if candidates else 0  # [5]: every row's count of candidates

        unread = [memory_id for memory_id, _ in chosen if memory_id not in rows]
        unread += [memory_id for memory_id, _, _ in echoes if memory_id not in rows]
        touch = track_access and bool(uncounted_ids)
        if touch or unread:
            # The access bookkeeping and the read of the rest share one round trip.
            # (A row deleted since the ranking is simply not returned; bumping its count is harmless.)
            touch_sql = (async_commit_sql() + _TOUCH_SQL) if touch else ""
            cursor.execute(touch_sql + (_ROWS_SQL if unread else ""),
                           {**params, "ids": uuid_array(unread), "chosen": uuid_array(uncounted_ids)})
            skip_to_rows(cursor)  # past the UPDATE to the rows
            if unread:
                rows.update((row[0], row) for row in cursor.fetchall())

        items: list[LoadedItem] = []
        used = total - remaining
        for memory_id, score in chosen:
            row = rows.get(memory_id)
            if row is None:  # deleted between the two reads: its tokens stay reserved (never over budget)
                continue
            _, kind, record_id, created_at, head, details_json = row
            # Django's connection hands jsonb back as text (its JSONField decodes it). The statement
            # built it of exactly the kind's detail fields (`_returned_columns_sql`), a missing one null.
            details = orjson.loads(details_json) if isinstance(details_json, str) else details_json or {}
            text = truncate_at_word(head, cap)
            tokens = estimate_tokens(text)
            used -= token_estimate_for_length(min(len(head), cap)) - tokens
            items.append(LoadedItem(
                id=memory_id, kind=kind, record_id=record_id, text=text, score=round(score, 4),
                tokens=tokens, truncated=len(head) > cap, created_at=created_at,
                details=details,
            ))

    echo_out = []
    for memory_id, kind, score in echoes:
        row = rows.get(memory_id)
        if row is None:
            continue
        words = row[4].split()
        hint = " ".join(words[:ECHO_WORDS]) + ("..." if len(words) > ECHO_WORDS else "")
        echo_out.append({"id": memory_id, "kind": kind, "hint": hint, "score": round(score, 4)})

    return LoadResult(
        budget_total=total, budget_used=used, item_chars=cap, checkpoint=checkpoint_out, boot_config=boot,
        memories=items, echoes=echo_out, excluded_count=excluded, generated_at=now,
    )
