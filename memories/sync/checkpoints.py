"""Kernle checkpoints are checkpoints: a pushed checkpoint episode also saves the stack's checkpoint.

`kernle checkpoint save` keeps its checkpoint on the device and syncs it as an episode: objective
`[CHECKPOINT] <task>`, outcome = the context (or "Working state checkpoint"), lessons = the pending
items, tags `checkpoint` and `working_state`, created_at = the client's time. The episode is stored
as any other (kernle pulls it back); for each such episode a push applied, this module saves the
stack's checkpoint through the one write path (`memories.services.checkpoint_save`), in the push's
transaction, with its change event (docs/kernle-protocol.md §3.12):

* task = the objective after the prefix; context = {"text": outcome} unless it is kernle's default;
  pending = the lessons, in order; saved_at = the episode's created_at; episode_record_id = its record id;
* one checkpoint per episode (a unique constraint, and `checkpoint_save` returns the existing one):
  a re-push of the same episode creates nothing and never fails;
* several in one push are saved oldest first, so the newest becomes "the" checkpoint;
* what is read is the episode as stored (already validated and redacted by the push), never the
  raw operation; an episode the push did not apply (a conflict) saves nothing. A stored episode that
  cannot make a valid checkpoint (a blank task) stays an episode, and the push goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from memories.models import Checkpoint, Memory, MemoryKind
from memories.records.vocabulary import CHECKPOINT_DEFAULT_OUTCOME, CHECKPOINT_OBJECTIVE_PREFIX
from memories.selectors import checkpoint_episode_q
from memories.services import CHECKPOINT_TEXT_MAX, CheckpointInput, checkpoint_save
from memories.sync.protocol import OpResult
from memoryhub.errors import DomainError
from stacks.models import Stack

logger = logging.getLogger(__name__)

CHECKPOINT_SOURCE = "sync"


def _episode_upserts(operations: Sequence[Any], results: Sequence[OpResult], *, native: bool) -> list[str]:
    """Record ids of the episode upserts the push applied, in either wire format."""
    record_ids = []
    for index, raw in enumerate(operations):
        if not (isinstance(raw, dict) and results[index].ok):
            continue
        if native:
            is_episode = raw.get("kind") == MemoryKind.EPISODE and raw.get("op", "upsert") != "delete"
        else:
            operation = raw.get("operation")
            is_episode = raw.get("table") == "episodes" and not (isinstance(operation, str)
                                                                 and operation.lower() == "delete")
        record_id = raw.get("record_id")
        if is_episode and isinstance(record_id, (str, int)) and not isinstance(record_id, bool):
            record_ids.append(str(record_id).strip())
    return record_ids


def checkpoint_input_of(episode: Memory) -> CheckpointInput:
    """The checkpoint a stored kernle checkpoint episode stands for."""
    data = episode.data or {}
    outcome = data.get("outcome")
    text = outcome.strip() if isinstance(outcome, str) else ""
    context = {"text": text[:CHECKPOINT_TEXT_MAX]} if text and text != CHECKPOINT_DEFAULT_OUTCOME else {}
    lessons = data.get("lessons")
    return CheckpointInput(
        task=str(data.get("objective", ""))[len(CHECKPOINT_OBJECTIVE_PREFIX):].strip(),
        context=context,
        pending=[item for item in lessons if isinstance(item, str)] if isinstance(lessons, list) else [],
        saved_at=episode.created_at, episode_record_id=episode.record_id,
    )


def save_pushed_checkpoints(*, stack: Stack, operations: Sequence[Any], results: Sequence[OpResult],
                            native: bool = False) -> int:
    """Save the checkpoint of every kernle checkpoint episode this push applied (caller holds the
    stack lock inside the push's transaction). Returns how many checkpoints were created."""
    record_ids = _episode_upserts(operations, results, native=native)
    if not record_ids:
        return 0
    episodes = (Memory.objects.filter(stack_id=stack.pk, kind=MemoryKind.EPISODE, record_id__in=record_ids,
                                      deleted_at__isnull=True)
                .filter(checkpoint_episode_q())
                .exclude(record_id__in=Checkpoint.objects.filter(stack_id=stack.pk, episode_record_id__in=record_ids)
                         .values("episode_record_id"))
                .order_by("created_at", "record_id"))
    created = 0
    for episode in episodes:
        try:
            with transaction.atomic():  # a refused one leaves no trace; the push goes on
                checkpoint_save(stack=stack, checkpoint=checkpoint_input_of(episode), source=CHECKPOINT_SOURCE)
            created += 1
        except DomainError as exc:
            # Ids and the error code only: never the text.
            logger.warning("kernle checkpoint episode %r of stack %s kept as an episode only: %s",
                           episode.record_id, stack.pk, exc.code)
    return created
