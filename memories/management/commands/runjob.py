"""Run a periodic job now, with a progress bar:
`manage.py runjob decay|ttl|promotion|embedding-sweep|stack-indexes`.

The same services as the Celery beat tasks, so the same rules hold: one run at a time (a run that
finds the previous one still going is recorded as skipped and exits with status 3), every run
recorded as a JobRun, `--now` to replay a run at a given time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime
from tqdm import tqdm

from memories.lifecycle.decay_pass import decay_pass
from memories.lifecycle.promotion import promotion_run
from memories.lifecycle.ttl import expired_count, live_memory_estimate, ttl_purge
from memories.models import JobRun
from memories.search.embedding_backlog import embedding_sweep_run
from memories.search.vector_indexes import stack_vector_indexes_run

JOBS = ("decay", "ttl", "promotion", "embedding-sweep", "stack-indexes")


class Command(BaseCommand):
    help = "Run a lifecycle job now (decay, ttl, promotion, embedding-sweep, stack-indexes) and show its progress."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", choices=JOBS)
        parser.add_argument("--now", help="ISO timestamp the job runs at (default: the current time).")
        parser.add_argument("--batch-size", type=int, default=None, help="Rows per batch (decay, ttl).")
        parser.add_argument("--max-rows", type=int, default=5000, help="Rows per run (embedding-sweep).")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (e.g. in logs).")

    def handle(self, *args: Any, **options: Any) -> None:
        now = None
        if options["now"]:
            now = parse_datetime(options["now"])
            if now is None or now.tzinfo is None:
                raise CommandError("--now must be an ISO timestamp with a time zone, e.g. 2026-01-31T02:00:00Z.")
        batch_size = options["batch_size"]
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        job = options["job"]
        total, unit = self._total(job, now)
        bar = tqdm(total=total, unit=unit, desc=job, disable=options["no_progress"], file=self.stderr._out)
        progress: Callable[[int], None] = bar.update
        try:
            run = self._run(job, now=now, batch_size=batch_size, max_rows=options["max_rows"], progress=progress)
        finally:
            bar.close()
        counts = ", ".join(f"{key}={value}" for key, value in run.counts.items())
        self.stdout.write(f"{job}: {run.status} in {run.duration_ms} ms ({counts}) [job run {run.pk}]")
        if run.status == JobRun.Status.SKIPPED:
            raise CommandError("Skipped: a previous run of this job is still in progress.", returncode=3)
        if run.status == JobRun.Status.FAILED:  # e.g. the embedding sweep refusing another model than the deployment's
            raise CommandError(run.error)

    def _total(self, job: str, now: Any) -> tuple[int | None, str]:
        if job == "decay":
            return live_memory_estimate() or None, "rows"
        if job == "ttl":
            return expired_count(now=now), "rows"
        if job == "promotion":
            return None, "stacks"
        if job == "stack-indexes":
            return 1, "indexes"
        return None, "rows"

    def _run(self, job: str, *, now: Any, batch_size: int | None, max_rows: int,
             progress: Callable[[int], None]) -> JobRun:
        sized = {"batch_size": batch_size} if batch_size else {}
        if job == "decay":
            return decay_pass(now=now, progress=progress, **sized)
        if job == "ttl":
            return ttl_purge(now=now, progress=progress, **sized)
        if job == "promotion":
            return promotion_run(now=now, progress=progress)
        if job == "stack-indexes":
            return stack_vector_indexes_run(progress=progress)
        return embedding_sweep_run(max_rows=max_rows, progress=progress)
