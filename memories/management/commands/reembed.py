"""Re-embed memories with the deployment's model, with a progress bar.

    manage.py reembed                 # redo vectors of another model, and anything awaiting one
    manage.py reembed --all           # redo every vector (e.g. after the model's weights changed)
    manage.py reembed --switch-model  # make this shell's model the deployment's, re-embedding all
    manage.py reembed --queue         # only mark them; let the workers' sweep do the embedding

The model is the one `EMBEDDING_PROVIDER` names in this shell, read like the service reads it
(memoryhub/settings.py: MiniLM unless set). If that is not the deployment's model
(memories.search.embedding_model), the command refuses with one line and changes nothing: a
second shell with another setting must never rewrite the vectors search compares queries with.
`--switch-model` is the deliberate way: it records this model as the deployment's, then
re-embeds every vector of another model (docs/algorithms.md §10.3).

Marking is one set-based UPDATE (`embedded_version = NULL`); the embedding then runs in batches
through the same claim-and-store path as the workers, so it can run next to them safely.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from tqdm import tqdm

from memories.search.embedding_backlog import (
    embedding_backlog_count,
    embedding_backlog_ids,
    embeddings_invalidate_all,
    embeddings_invalidate_stale_model,
)
from memories.search.embedding_jobs import EMBED_BATCH_SIZE, memories_embed
from memories.search.embedding_model import EmbeddingModelMismatch, deployment_model_claim, deployment_model_switch
from memories.search.embeddings import get_embedder


class Command(BaseCommand):
    help = "Re-embed memories whose vector is missing or was made by another model than the deployment's."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--all", action="store_true", help="Re-embed every memory, not only stale ones.")
        parser.add_argument("--switch-model", action="store_true",
                            help="Make this shell's EMBEDDING_PROVIDER model the deployment's and re-embed "
                                 "every vector of another model (the service must then run with the same setting).")
        parser.add_argument("--queue", action="store_true", help="Only mark rows; the periodic sweep embeds them.")
        parser.add_argument("--batch-size", type=int, default=EMBED_BATCH_SIZE * 4)

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = get_embedder()
        model_id = embedder.model_id  # a name and a dimension: no model is loaded to know it
        with transaction.atomic():
            if options["switch_model"]:
                previous = deployment_model_switch(model_id)
                if previous != model_id:
                    self.stdout.write(f"deployment embedding model: {previous or 'none'} -> {model_id}")
            else:
                deployment = deployment_model_claim(model_id)
                if deployment.model_id != model_id:
                    raise CommandError(str(EmbeddingModelMismatch(configured=model_id, deployment=deployment.model_id)))
                since = deployment.recorded_at.isoformat(timespec="minutes")
                self.stdout.write(f"deployment embedding model: {model_id} (since {since})")
            marked = embeddings_invalidate_all() if options["all"] else embeddings_invalidate_stale_model(
                model_id=model_id)
        total = embedding_backlog_count()
        self.stdout.write(f"model {model_id}: {marked} marked for re-embedding, {total} in the backlog")
        if options["queue"]:
            return
        embedded = skipped = 0
        seen: set[str] = set()
        with tqdm(total=total, unit="memory", disable=not total, file=self.stderr._out) as progress:
            while True:
                ids = [i for i in embedding_backlog_ids(limit=max(1, options["batch_size"])) if i not in seen]
                if not ids:
                    break
                seen.update(ids)
                result = memories_embed(ids=ids, embedder=embedder)
                if result.refused:  # the deployment was switched by someone else meanwhile
                    raise CommandError(f"stopped after {embedded} embedded: the deployment's model changed "
                                       f"while this ran; nothing more was written.")
                embedded += result.embedded
                skipped += result.skipped_claimed + result.skipped_stale
                progress.update(len(ids))
        self.stdout.write(f"{embedded} embedded, {skipped} skipped (held by a worker or changed meanwhile), "
                          f"{embedding_backlog_count()} awaiting")
