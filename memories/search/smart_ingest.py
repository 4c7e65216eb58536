"""Smart ingest: prediction-error gating decides create / reinforce / update / supersede.

docs/algorithms.md §6 (the rules MemoryHub adopts), in the order they are applied:

1. The payload is validated and normalised first (`memories.writes.hooks.prepare_memory`: the
   schema, then the kernel's transforms), so similarity is only ever computed on the stored text.
2. `force_create` bypasses the gate and is recorded as such.
3. `supersedes` (an explicit request) creates the new memory and tombstones the named one.
   Nothing is ever superseded automatically.
4. Candidates: the 10 nearest memories of the same kind in the stack (cosine over current-model
   vectors, exact), of which the best 5 are considered; `similarity` is the best one's cosine.
5. The contradiction check runs FIRST. A contradicting near neighbour (≥ correction threshold) is
   never reinforced and never merged into: a new memory is created and linked to it (a
   `contradicted` revision on the old memory names the new one) and the old one is left for review.
6. ≥ near-identical: REINFORCE (a bounded FSRS review; content unchanged).
7. ≥ update: MERGE into the neighbour ("update"), unless it was demoted, is strong (protected,
   promoted, or stability ≥ STRONG_STABILITY_DAYS) or its kind has no single text field — then a
   linked new memory is created instead. Every merge keeps the text before, the incoming text, the
   text after and a unified diff in a `merge` revision; the update revision holds the full
   before-state, so a merge can be inspected and undone.
8. Otherwise CREATE, with prediction error 1 - similarity.

Privacy grants (docs/privacy.md "Privacy grants"): a requester other than the stack's own
credentials (a school key, a signed-in admin or teacher) passes its `audience`, and the neighbour
query carries the grants predicate (memories.privacy.grants.grants_sql) before its LIMIT. A memory the
requester may not see is therefore absent from the gate, as if it did not exist: it is never
reinforced, merged into, linked, superseded or listed in `considered`, and when it is the only close
neighbour the new memory is simply created. The answer (`memory`, `target_id`, `reason`,
`considered`) can only name memories the requester sees. Independently of who asks, new text is
only folded into a memory (reinforce, merge) whose `access_grants` are the same set as its own:
otherwise the two audiences differ, and a linked new memory is created instead, its note on the
neighbour without the incoming text.

Every decision is written down: in the response (`decision, similarity, measure,
prediction_error, target_id, reason`) and as a `MemoryRevision(source="ingest")` on the memory it
touched (the reinforced, merged, linked or superseded one).

Writes go through the write kernel (`memories.writes`): new, merged and superseded memories through
the services built on it; a reinforcement (decay state, not a change: no version bump) locks the
row as the kernel does. After commit the change listeners hear every one of them, and each decision
note ("reinforce", "contradicted", "linked", "superseded", "merge"), as `source="ingest"`.
"""

from __future__ import annotations

import difflib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from accounts.authors import Author, job_author
from memories.lifecycle.decay import DecayState, Grade, base_stability, review
from memories.models import Memory
from memories.privacy.grants import Audience, grants_filter, grants_sql
from memories.privacy.redaction.policy import stack_policy
from memories.search.embedding_model import deployment_model_mismatch
from memories.search.embedding_store import store_vectors
from memories.search.embeddings import get_embedder, vector_literal
from memories.search.retrieval_feedback import DEMOTE, PROMOTE, latest_feedback
from memories.services import memory_create, memory_forget, memory_update
from memories.writes.hooks import prepare_author, prepare_memory
from memories.writes.rows import locked_memory, note_revision
from memoryhub.errors import InvalidInput, NotFound
from stacks.models import Stack

INGEST_SOURCE = "ingest"
CANDIDATES = 10
CONSIDERED = 5
STRONG_STABILITY_DAYS = 90.0
# Kinds whose content is one free-text field we can append an update to.
MERGE_FIELD = {"note": "content", "belief": "statement"}


@dataclass(frozen=True)
class Thresholds:
    near_identical: float = 0.92
    update: float = 0.75
    correction: float = 0.70

    @property
    def merge_band(self) -> float:
        return 0.9 * self.update

    @classmethod
    def from_request(cls, raw: Any) -> Thresholds:
        if raw in (None, {}):
            return cls()
        if not isinstance(raw, dict):
            raise InvalidInput("Invalid thresholds.", fields={"thresholds": ["Must be an object."]})
        values: dict[str, float] = {}
        for name in ("near_identical", "update", "correction"):
            if name in raw:
                value = raw[name]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise InvalidInput("Invalid thresholds.", fields={f"thresholds.{name}": ["Must be a number."]})
                values[name] = min(1.0, max(0.0, float(value)))  # clamp, as for search (§7.4)
        return cls(**values)


@dataclass
class IngestDecision:
    decision: str  # create | reinforce | update | supersede
    memory: Memory  # the memory that now holds the content
    similarity: float | None
    measure: str
    prediction_error: float
    target_id: str | None
    reason: str
    forced: bool = False
    contradiction: bool = False
    considered: list[dict[str, Any]] = field(default_factory=list)

    @property
    def created(self) -> bool:
        """Did the decision store a new memory (a REST answer's 201) rather than change one (200)?"""
        return self.decision in ("create", "supersede")

    def as_json(self) -> dict[str, Any]:
        """The decision's wire form, one for the REST route and the MCP `remember` tool."""
        memory = self.memory
        return {
            "decision": self.decision,
            "memory": {"id": str(memory.pk), "record_id": memory.record_id, "kind": memory.kind,
                       "text": memory.text, "version": memory.version, "redaction_report": memory.redaction_report},
            "similarity": None if self.similarity is None else round(self.similarity, 6),
            "measure": self.measure,
            "prediction_error": self.prediction_error,
            "target_id": self.target_id,
            "reason": self.reason,
            "forced": self.forced,
            "contradiction": self.contradiction,
            "considered": self.considered,
        }


# Word-boundary versions of the §6.2 markers ("badge", "prefixed" and "cannot " must not fire).
_NEGATIONS = [r"don'?t", r"never", r"avoid", r"wrong", r"bad", r"incorrect", r"deprecated", r"outdated",
              r"instead of", r"rather than", r"not", r"no longer", r"isn'?t", r"doesn'?t"]
_CORRECTIONS = [r"actually", r"correction", r"update:", r"fixed", r"was wrong", r"should be", r"better approach",
                r"improved", r"the right way"]


def _has(pattern: str, text: str) -> bool:
    return re.search(rf"(?<![\w']){pattern}(?![\w'])", text, re.IGNORECASE) is not None


def appears_contradictory(new_text: str, old_text: str) -> bool:
    """§6.2 with word boundaries: a negation the old text lacks, or a correction phrase."""
    if any(_has(p, new_text) and not _has(p, old_text) for p in _NEGATIONS):
        return True
    return any(_has(p, new_text) for p in _CORRECTIONS)


def _neighbours(stack: Stack, kind: str, vector: list[float],
                audience: Audience | None) -> tuple[list[tuple[Memory, float]], str]:
    embedder = get_embedder()
    # The requester's grants inside the query, before the LIMIT: a hidden memory takes no candidate slot.
    grants, grant_params = grants_sql(audience, "m")
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT m.id, 1 - (m.embedding <=> %(v)s::vector) AS similarity
              FROM memories_memory m
             WHERE m.stack_id = %(stack)s AND m.kind = %(kind)s AND m.deleted_at IS NULL
               AND m.forgotten_at IS NULL AND m.embedding IS NOT NULL AND m.embedding_model = %(model)s
               AND {grants}
             ORDER BY (m.embedding <=> %(v)s::vector) + 0
             LIMIT %(limit)s
            """,  # noqa: S608 (the predicate is memories.privacy.grants' own SQL; its values are parameters)
            {"v": vector_literal(vector), "stack": stack.pk, "kind": kind, "model": embedder.model_id,
             "limit": CANDIDATES, **grant_params},
        )
        rows = cursor.fetchall()[:CONSIDERED]
    memories = Memory.objects.defer("embedding", "search_vector").in_bulk([r[0] for r in rows])
    return [(memories[r[0]], float(r[1])) for r in rows if r[0] in memories], f"cosine:{embedder.model_id}"


def _same_grants(memory: Memory, incoming: list[str] | None) -> bool:
    """Whether folding text into `memory` keeps it before the same audience the writer chose."""
    return set(memory.access_grants or ()) == set(incoming or ())


def _is_strong(memory: Memory, feedback: str | None) -> bool:
    return memory.is_protected or feedback == PROMOTE or base_stability(DecayState.of(memory)) >= STRONG_STABILITY_DAYS


def _note(memory: Memory, action: str, reason: str, snapshot: dict[str, Any], author: Author) -> None:
    note_revision(memory, source=INGEST_SOURCE, author=author, action=action, reason=reason, snapshot=snapshot)


@transaction.atomic
def smart_ingest(*, stack: Stack, kind: str, payload: dict[str, Any], force_create: bool = False,
                 supersedes: str | None = None, thresholds: Thresholds | None = None,
                 audience: Audience | None = None, author: Author | None = None) -> IngestDecision:
    """Store `payload` as a `kind` memory of `stack`, or fold it into an existing one (module docstring).

    Precondition: the caller resolved `stack` with write access (stacks.selectors). `audience`: the
    requester's privacy grants (memories.privacy.grants.audience_for; None for the stack's own credentials):
    memories it may not see are left out of the gate and `supersedes` (a hidden one is a 404).
    `author`: the caller (docs/privacy.md "Provenance"), the author of whatever the decision writes —
    the new memory, the merge, the notes on the neighbour; None: the server's own (`job_author`).
    """
    thresholds = thresholds or Thresholds()
    # The payload as it would be stored (schema + the kernel's transforms), so similarity is computed
    # on the stored text; InvalidInput / PayloadTooLarge before anything else.
    policy = stack_policy(stack)
    normalized = prepare_memory(kind, payload, redaction=policy)
    author = prepare_author(author if author is not None else job_author(INGEST_SOURCE), redaction=policy)
    measure = "none"

    if supersedes is not None:
        old = grants_filter(Memory.objects.filter(stack=stack, pk=_uuid(supersedes), deleted_at__isnull=True),
                            audience).first()
        if old is None:
            raise NotFound("The memory to supersede was not found in this stack.", code="memory_not_found",
                           fields={"supersedes": ["No such memory in this stack."]})
        new = memory_create(stack=stack, kind=kind, payload=payload, source=INGEST_SOURCE, author=author)
        reason = f"explicitly superseded by {new.pk}"
        memory_forget(memory=old, reason="superseded", source=INGEST_SOURCE, author=author)
        _note(old, "superseded", reason, {"superseded_by": str(new.pk), "text": old.text}, author)
        return IngestDecision("supersede", new, None, measure, 1.0, str(old.pk), reason)

    if force_create:
        new = memory_create(stack=stack, kind=kind, payload=payload, source=INGEST_SOURCE, author=author)
        return IngestDecision("create", new, None, measure, 1.0, None,
                              "force_create: the gate was bypassed on request", forced=True)

    # Similarity means something only between vectors of one model: a process set for another
    # model than the deployment's (memories.search.embedding_model) compares nothing and says so.
    refusal = deployment_model_mismatch(get_embedder().model_id) if normalized.text else None
    vector = get_embedder().embed([normalized.text])[0] if normalized.text and refusal is None else None
    candidates, measure = _neighbours(stack, kind, vector, audience) if vector is not None else ([], "none")

    def create() -> Memory:
        memory = memory_create(stack=stack, kind=kind, payload=payload, source=INGEST_SOURCE, author=author)
        if vector is not None:
            # We already hold its vector: store it now, so the next ingest (seconds later) sees it.
            store_vectors([(str(memory.pk), memory.version)], [vector], get_embedder().model_id)
        return memory

    considered = [{"id": str(m.pk), "similarity": round(s, 4)} for m, s in candidates]
    if not candidates:
        new = create()
        why = ("similarity not measured: this process embeds with another model than the deployment's "
               f"({refusal.deployment}); created" if refusal is not None
               else "no similar memory of this kind: new information")
        return IngestDecision("create", new, None, measure, 1.0, None, why, considered=considered)

    best, similarity = candidates[0]
    error = round(1.0 - max(0.0, similarity), 6)
    feedback = latest_feedback([str(best.pk)]).get(str(best.pk))
    same_grants = _same_grants(best, normalized.columns.get("access_grants"))

    def linked_create(why: str, action: str = "linked", contradiction: bool = False) -> IngestDecision:
        new = create()
        reason = f"{why}; created {new.pk} linked to {best.pk} (similarity {similarity:.3f})"
        snapshot: dict[str, Any] = {"linked_memory": str(new.pk), "similarity": similarity, "text": best.text}
        if same_grants:  # the note is read with `best`: the new text only where its own grants admit the same
            snapshot["incoming_text"] = normalized.text
        _note(best, action, reason, snapshot, author)
        return IngestDecision("create", new, similarity, measure, error, str(best.pk), reason,
                              contradiction=contradiction, considered=considered)

    if similarity >= thresholds.correction and appears_contradictory(normalized.text, best.text):
        return linked_create("the new text contradicts a similar memory, which is never reinforced or merged "
                             "and is left for review", action="contradicted", contradiction=True)

    if similarity >= thresholds.update and not same_grants:
        return linked_create("similar to a memory with other access grants, which is never reinforced or merged "
                             "into (the two would be read by different audiences)")

    if similarity >= thresholds.near_identical:
        now = timezone.now()
        locked = locked_memory(best)
        outcome = review(DecayState.of(locked), locked.difficulty, Grade.GOOD, now)
        reason = f"near-identical to {best.pk} (similarity {similarity:.3f}): reinforced, content unchanged"
        _note(locked, "reinforce", reason, {"stability": locked.stability, "difficulty": locked.difficulty,
                                            "last_reviewed_at": locked.last_reviewed_at.isoformat()
                                            if locked.last_reviewed_at else None,
                                            "incoming_text": normalized.text}, author)
        Memory.objects.filter(pk=locked.pk).update(stability=outcome.stability, difficulty=outcome.difficulty,
                                                   last_reviewed_at=now)
        locked.refresh_from_db()
        return IngestDecision("reinforce", locked, similarity, measure, error, str(best.pk), reason,
                              considered=considered)

    if similarity >= thresholds.update:
        if feedback == DEMOTE:
            return linked_create("similar to a demoted memory, which is never superseded automatically")
        if _is_strong(best, feedback):
            return linked_create("similar to a strong (protected, promoted or long-stable) memory, "
                                 "which is never merged into")
        field_name = MERGE_FIELD.get(kind)
        if field_name is None:
            return linked_create(f"similar, but {kind} memories are not merged")
        return _merge(best, field_name, normalized.data[field_name], normalized.text, similarity, measure, error,
                      considered, author)

    strong_neighbours = sum(1 for _, s in candidates if s >= thresholds.merge_band)
    if strong_neighbours >= 2:
        return linked_create(f"{strong_neighbours} memories are in the merge band; kept separate and linked")
    new = create()
    return IngestDecision("create", new, similarity, measure, error, None,
                          f"new information (best similarity {similarity:.3f} below {thresholds.update})",
                          considered=considered)


def _merge(target: Memory, field_name: str, incoming: str, incoming_text: str, similarity: float, measure: str,
           error: float, considered: list[dict[str, Any]], author: Author) -> IngestDecision:
    before_text = target.text
    old_value = str(target.data.get(field_name, ""))
    merged_value = f"{old_value}\n\n[Updated {timezone.now().date().isoformat()}]\n{incoming}"
    updated = memory_update(memory=target, payload={field_name: merged_value}, source=INGEST_SOURCE, author=author)
    diff = "\n".join(difflib.unified_diff(before_text.splitlines(), updated.text.splitlines(),
                                          "before", "after", lineterm=""))
    reason = f"similar to {target.pk} (similarity {similarity:.3f}): merged the new text into it"
    _note(updated, "merge", reason, {"before_text": before_text, "incoming_text": incoming_text,
                                     "after_text": updated.text, "diff": diff, "field": field_name,
                                     "version_before": updated.version - 1}, author)
    return IngestDecision("update", updated, similarity, measure, error, str(target.pk), reason,
                          considered=considered)


def _uuid(value: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError as exc:
        raise InvalidInput("Invalid memory id.", fields={"supersedes": ["Must be a memory id (UUID)."]}) from exc
