"""The lifecycle jobs as operators and the scheduler run them: Celery tasks on a real worker,
the beat schedule, and `manage.py runjob`."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from memories.lifecycle.jobs import JOB_EMBEDDING_SWEEP, JOB_STACK_VECTOR_INDEXES
from memories.lifecycle.tasks import decay_pass_task, promotion_run_task, ttl_purge_task
from memories.models import JobRun, Memory
from memories.services import memory_create
from memories.tasks import embedding_sweep_task
from memoryhub.celery import app
from memoryhub.schedule import BEAT_SCHEDULE
from tests.factories import make_org, make_stack
from tests.memories.test_lifecycle import _hold_lock_elsewhere, _release_lock_elsewhere


def _old_memory(stack, record_id: str, days: int = 300) -> Memory:
    created = timezone.now() - timedelta(days=days)
    return Memory.objects.create(stack=stack, kind="note", record_id=record_id, text=record_id,
                                 created_at=created, server_updated_at=created)


def _episodes_with_a_shared_lesson(stack) -> None:
    for n in range(3):
        memory_create(stack=stack, kind="episode", source="api", payload={
            "objective": f"fractions practice {n}", "outcome": "done",
            "lessons": ["Draw the picture first." if n % 2 == 0 else "draw the picture first", f"lesson {n}"],
        })


def test_every_lifecycle_job_is_on_the_beat_schedule_with_a_registered_task():
    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in BEAT_SCHEDULE.values()}
    assert {"memories.decay_pass", "memories.ttl_purge", "memories.promotion_run",
            "memories.embedding_sweep"} <= scheduled
    for entry in BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry["task"]
        assert entry["options"]["expires"] > 0
    for task in (decay_pass_task, ttl_purge_task, promotion_run_task, embedding_sweep_task):
        assert task.soft_time_limit is not None and task.time_limit is not None
        assert task.soft_time_limit < task.time_limit


@pytest.mark.django_db(transaction=True)
def test_tasks_run_on_a_real_worker_and_record_their_runs(celery_worker):
    stack = make_stack(make_org())
    faded = _old_memory(stack, "faded")
    expired = _old_memory(stack, "expired", days=1)
    Memory.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    _episodes_with_a_shared_lesson(stack)

    decay = decay_pass_task.delay().get(timeout=60)
    ttl = ttl_purge_task.delay().get(timeout=60)
    promotion = promotion_run_task.delay().get(timeout=60)

    assert decay["status"] == "succeeded" and decay["forgotten"] == 1
    assert Memory.objects.get(pk=faded.pk).forgotten_reason == "salience_decay"
    assert ttl["status"] == "succeeded" and ttl["purged"] == 1
    assert not Memory.objects.filter(pk=expired.pk).exists()
    assert promotion["status"] == "succeeded" and promotion["beliefs_created"] == 1
    assert Memory.objects.filter(stack=stack, kind="belief").count() == 1
    # Idempotent: running promotion again creates nothing twice.
    assert promotion_run_task.delay().get(timeout=60)["beliefs_created"] == 0
    assert Memory.objects.filter(stack=stack, kind="belief").count() == 1
    runs = list(JobRun.objects.order_by("pk").values_list("name", "status"))
    assert runs == [("decay", "succeeded"), ("ttl_purge", "succeeded"), ("promotion", "succeeded"),
                    ("promotion", "succeeded")]


@pytest.mark.django_db(transaction=True)
def test_the_scheduled_embedding_sweep_embeds_what_was_missed_and_records_its_run(celery_worker):
    stack = make_stack(make_org())
    missed = _old_memory(stack, "written while the broker was down", days=1)  # never queued
    assert Memory.objects.get(pk=missed.pk).embedding is None

    result = embedding_sweep_task.delay().get(timeout=60)

    assert result["status"] == "succeeded" and result["embedded"] == 1
    assert Memory.objects.get(pk=missed.pk).embedding is not None
    run = JobRun.objects.get(pk=result["job_run"])
    assert (run.name, run.status, run.counts["embedded"]) == (JOB_EMBEDDING_SWEEP, "succeeded", 1)


# Committed, as a deployment's run is: inside a test's transaction every decay batch's temporary
# table keeps its locks to the end, and over a memory table earlier tests left sparse the batches
# can outgrow PostgreSQL's lock table.
@pytest.mark.django_db(transaction=True)
def test_runjob_runs_a_job_now_with_a_progress_bar():
    stack = make_stack(make_org())
    for n in range(5):
        _old_memory(stack, f"m{n}", days=n * 100)
    out, err = io.StringIO(), io.StringIO()
    call_command("runjob", "decay", "--batch-size", "2", stdout=out, stderr=err)
    assert "decay: succeeded" in out.getvalue()
    assert "scanned=5, updated=5, forgotten=3, batches=" in out.getvalue()
    assert "decay" in err.getvalue()  # the tqdm bar
    run = JobRun.objects.get(name="decay")
    assert run.counts["scanned"] == 5

    later = (timezone.now() + timedelta(days=1)).isoformat()
    Memory.objects.filter(record_id="m0").update(expires_at=timezone.now())
    call_command("runjob", "ttl", "--now", later, "--no-progress", stdout=out, stderr=err)
    assert "ttl: succeeded" in out.getvalue() and "purged=1" in out.getvalue()
    call_command("runjob", "promotion", "--no-progress", stdout=out, stderr=err)
    assert "promotion: succeeded" in out.getvalue()
    call_command("runjob", "embedding-sweep", "--no-progress", stdout=out, stderr=err)
    assert "embedding-sweep: succeeded" in out.getvalue()
    assert JobRun.objects.filter(name=JOB_EMBEDDING_SWEEP, status="succeeded").exists()


@pytest.mark.django_db
def test_runjob_reports_a_skipped_run_and_rejects_bad_arguments():
    other = _hold_lock_elsewhere("decay")
    try:
        with pytest.raises(CommandError) as skipped:
            call_command("runjob", "decay", "--no-progress", stdout=io.StringIO(), stderr=io.StringIO())
    finally:
        _release_lock_elsewhere(other)
    assert skipped.value.returncode == 3
    assert JobRun.objects.get(name="decay").status == JobRun.Status.SKIPPED
    with pytest.raises(CommandError):
        call_command("runjob", "decay", "--now", "yesterday", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("runjob", "decay", "--batch-size", "0", stdout=io.StringIO())
    assert JobRun.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_stack_index_upkeep_is_a_recorded_job_and_an_overlapping_run_builds_nothing():
    from memories.search.vector_indexes import stack_index_name, stacks_with_vector_index
    from stacks.models import Stack

    stack = make_stack(make_org())
    Stack.objects.filter(pk=stack.pk).update(memory_count=20_000)  # past the threshold
    try:
        other = _hold_lock_elsewhere(JOB_STACK_VECTOR_INDEXES)
        try:
            with pytest.raises(CommandError) as skipped:
                call_command("runjob", "stack-indexes", "--no-progress", stdout=io.StringIO(),
                             stderr=io.StringIO())
        finally:
            _release_lock_elsewhere(other)
        assert skipped.value.returncode == 3
        assert stack.pk not in stacks_with_vector_index(refresh=True)  # the skipped run built nothing

        out = io.StringIO()
        call_command("runjob", "stack-indexes", "--no-progress", stdout=out, stderr=io.StringIO())
        assert "stack-indexes: succeeded" in out.getvalue() and "built=1" in out.getvalue()
        assert stack.pk in stacks_with_vector_index(refresh=True)
        runs = list(JobRun.objects.filter(name=JOB_STACK_VECTOR_INDEXES).order_by("started_at")
                    .values_list("status", flat=True))
        assert runs == [JobRun.Status.SKIPPED, JobRun.Status.SUCCEEDED]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP INDEX IF EXISTS "{stack_index_name(stack.pk)}"')
        stacks_with_vector_index(refresh=True)
