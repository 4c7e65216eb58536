"""The benchmarks' service runs another checkout of the code as `make run` would run it
(bench/service.py): an A/B measures the code, not two embedding runtimes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from bench import service
from bench.service import BASE_DIR, ONNX_EXPORT, RunnerService, checkout_env


def test_a_checkout_without_an_export_embeds_with_this_checkouts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    this, other = tmp_path / "this", tmp_path / "other"
    (this / ONNX_EXPORT).mkdir(parents=True)
    other.mkdir()
    monkeypatch.setattr(service, "BASE_DIR", this)  # whether or not the real checkout has its export yet
    assert checkout_env(other) == {"MINILM_ONNX_DIR": str(this / ONNX_EXPORT)}


def test_this_checkout_a_checkout_with_its_own_export_or_a_chosen_one_are_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    assert checkout_env(BASE_DIR) == {}
    (tmp_path / ONNX_EXPORT).mkdir(parents=True)
    assert checkout_env(tmp_path) == {}
    monkeypatch.setenv("MINILM_ONNX_DIR", "/elsewhere")
    assert checkout_env(tmp_path.parent) == {}


def test_a_bench_run_from_a_worktree_borrows_the_export_of_the_checkout_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    main, tree = tmp_path / "main", tmp_path / "tree"
    main.mkdir()
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "-C", str(main)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    subprocess.run([*git, "worktree", "add", "-q", str(tree)], check=True)
    (main / ONNX_EXPORT).mkdir(parents=True)
    monkeypatch.setattr(service, "BASE_DIR", tree)  # the bench itself runs from the worktree
    assert checkout_env(tree) == {"MINILM_ONNX_DIR": str(main.resolve() / ONNX_EXPORT)}


def test_the_errors_a_run_logged_are_named_with_the_exception_they_ended_in(tmp_path: Path) -> None:
    log = tmp_path / "runner.log"
    log.write_text(
        "2026-12-04 13:25:50,100 WARNING django.request [-]: Too Many Requests: /sync/push\n"
        "2026-12-04 13:25:50,368 ERROR django.request [ab12]: Internal Server Error: /sync/push\n"
        "Traceback (most recent call last):\n"
        '  File "memories/writes/outbox.py", line 95, in _run\n'
        "psycopg.ProgrammingError: (raised by psycopg itself, not by PostgreSQL: no result available)\n"
        'INFO:     127.0.0.1:40112 - "POST /sync/push HTTP/1.1" 500\n'  # uvicorn's, interleaved
        "2026-12-04 13:25:51,000 CRITICAL celery.worker [-]: worker lost\n"
        "[memoryhub] embedding resumes\n")
    runner = RunnerService("", tmp_path, {"MEMORYHUB_REDIS_PORT": "0"}, cast(Any, None), log)
    assert runner.errors_logged() == [
        "2026-12-04 13:25:50,368 ERROR django.request [ab12]: Internal Server Error: /sync/push  <- "
        "psycopg.ProgrammingError: (raised by psycopg itself, not by PostgreSQL: no result available)",
        "2026-12-04 13:25:51,000 CRITICAL celery.worker [-]: worker lost",
    ]
    assert runner.worker_priority_switches() == ["embedding resumes"]
