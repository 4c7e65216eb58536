"""The Celery application. Tasks live in each app's tasks.py; the beat schedule is in code here."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import before_task_publish, setup_logging, task_postrun, task_prerun, worker_process_init

from memoryhub import requestid
from memoryhub.cpu_priority import backend_follows_worker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")

app = Celery("memoryhub")
app.config_from_object("django.conf:settings", namespace="CELERY")


def _configure_logging(**_: object) -> None:
    """The worker and beat log through settings.LOGGING, not Celery's own setup: its formatter and
    filter keep database errors' messages (which can quote a stored row) out of the log
    (docs/privacy.md "Logs")."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


setup_logging.connect(_configure_logging)
# A request's id follows the tasks it sends into the worker's log lines (memoryhub/requestid.py).
before_task_publish.connect(requestid.add_to_task_headers)
task_prerun.connect(requestid.enter_task)
task_postrun.connect(requestid.leave_task)


def _settle_worker_heap(**_: object) -> None:
    """Each pool process, once forked with the tasks imported: its heap out of the collector's walks."""
    from memoryhub.interpreter import settle_heap

    settle_heap()


worker_process_init.connect(_settle_worker_heap)
# Each task: the worker's database backend yields the cores as the worker does.
task_prerun.connect(backend_follows_worker)
app.autodiscover_tasks()
# Infrastructure tasks live in the project package, which is not an installed app; the lifecycle
# room's tasks in a sub-package, which autodiscovery (`<app>.tasks` only) does not visit.
app.conf.imports = ("memoryhub.tasks", "memories.lifecycle.tasks")
# The beat schedule (periodic jobs) lives in code, in memoryhub/schedule.py.
from memoryhub.schedule import BEAT_SCHEDULE, TASK_ROUTES, on_periodic_queue  # noqa: E402

app.conf.beat_schedule = on_periodic_queue(BEAT_SCHEDULE)
app.conf.task_routes = TASK_ROUTES
# The worker stops taking embedding tasks while the runner holds embedding back (docs/operations.md §8).
from memoryhub.embedding_hold import EmbeddingHold  # noqa: E402

app.steps["consumer"].add(EmbeddingHold)
