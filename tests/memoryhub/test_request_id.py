"""A request id on every log line of a request and of the Celery tasks it queued; JSON logs."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest
from django.db import IntegrityError

from memoryhub.logsafety import SafeJsonFormatter
from memoryhub.requestid import RequestIdFilter, current_request_id
from tests.actors import School


@pytest.mark.django_db
def test_the_clients_request_id_is_echoed_and_a_bad_one_replaced(school: School) -> None:
    kept = school.agent.get(school.stack_url("memories"), HTTP_X_REQUEST_ID="lb-7f3a9c21")
    assert kept.status_code == 200 and kept["X-Request-ID"] == "lb-7f3a9c21"
    for bad in ("short", "has spaces in it", "x" * 65, "semi;colon-12345"):
        made = school.agent.get(school.stack_url("memories"), HTTP_X_REQUEST_ID=bad)
        assert re.fullmatch(r"[0-9a-f]{32}", made["X-Request-ID"]), bad
    assert school.agent.get(school.stack_url("memories"))["X-Request-ID"] != made["X-Request-ID"]


def test_json_lines_carry_the_request_id_and_withhold_database_errors() -> None:
    formatter = SafeJsonFormatter("%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
                                  rename_fields={"asctime": "time", "levelname": "level", "name": "logger"})
    token = current_request_id.set("req-12345678")
    try:
        database_message = "null value violates not-null constraint DETAIL: Failing row contains (my secret)"
        try:
            raise IntegrityError(database_message)
        except IntegrityError:
            import sys

            record = logging.LogRecord("memories", logging.ERROR, __file__, 1, "push failed", None, sys.exc_info())
        RequestIdFilter().filter(record)
        line = json.loads(formatter.format(record))
    finally:
        current_request_id.reset(token)
    assert line["request_id"] == "req-12345678" and line["level"] == "ERROR" and line["message"] == "push failed"
    assert "my secret" not in json.dumps(line) and "message withheld" in line["exc_info"]


@pytest.mark.django_db(transaction=True)
def test_the_worker_logs_a_queued_task_under_the_requests_id(school: School, celery_worker: Any) -> None:
    created = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "Likes chess"},
                                format="json", HTTP_X_REQUEST_ID="trace-0123456789")
    assert created.status_code == 201, created.content
    log_path = celery_worker.log_path
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "[trace-0123456789]" not in log_path.read_text():
        time.sleep(0.2)
    lines = [line for line in log_path.read_text().splitlines() if "[trace-0123456789]" in line]
    assert any("memories." in line for line in lines), lines  # the embedding task's own lines
    assert not any("Likes chess" in line for line in log_path.read_text().splitlines())
