"""Re-embed memories after a model change, with a progress bar.

    manage.py reembed            # redo vectors made by another model, and anything awaiting one
    manage.py reembed --all      # redo every vector (e.g. after changing the model's weights)
    manage.py reembed --queue    # only mark them; let the workers' sweep do the embedding

Marking is one set-based UPDATE (`embedded_version = NULL`); the embedding then runs in batches
through the same claim-and-store path as the workers, so it can run next to them safely.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from tqdm import tqdm

from memories.search.embedding_jobs import (
    EMBED_BATCH_SIZE,
    embedding_backlog_count,
    embedding_backlog_ids,
    embeddings_invalidate_all,
    embeddings_invalidate_stale_model,
    memories_embed,
)
from memories.search.embeddings import get_embedder


class Command(BaseCommand):
    help = "Re-embed memories whose vector is missing or was made by another model."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--all", action="store_true", help="Re-embed every memory, not only stale ones.")
        parser.add_argument("--queue", action="store_true", help="Only mark rows; the periodic sweep embeds them.")
        parser.add_argument("--batch-size", type=int, default=EMBED_BATCH_SIZE * 4)

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = get_embedder()
        if options["all"]:
            marked = embeddings_invalidate_all()
        else:
            marked = embeddings_invalidate_stale_model(model_id=embedder.model_id)
        total = embedding_backlog_count()
        self.stdout.write(f"model {embedder.model_id}: {marked} marked for re-embedding, {total} in the backlog")
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
                embedded += result.embedded
                skipped += result.skipped_claimed + result.skipped_stale
                progress.update(len(ids))
        self.stdout.write(f"{embedded} embedded, {skipped} skipped (held by a worker or changed meanwhile), "
                          f"{embedding_backlog_count()} awaiting")
