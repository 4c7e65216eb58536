"""Settings come from the environment; a bad value stops start-up naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts manage.py or the runner

BASE_DIR = Path(__file__).resolve().parents[2]


def _django_check(**env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **env_overrides)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DEBUG", "maybe"), ("DATABASE_URL", "mysql://x@y/z"), ("REDIS_URL", "nope"), ("PORT", "eighty"),
     ("MEMORYHUB_PG_PORT", "70000"), ("SECRET_KEY", "short"), ("EMBEDDING_PROVIDER", "magic"),
     ("PYTHON_GC_TUNING", "sometimes"), ("PYTHON_GIL_SWITCH_MS", "0"), ("WORKER_CPU_NICE", "20"),
     ("WORKER_CPU_IDLE", "sometimes"), ("EMBEDDING_CATCH_UP_SECONDS", "-1")],
)
def test_bad_value_fails_at_start_up_naming_the_variable(variable: str, value: str) -> None:
    runner = subprocess.run([sys.executable, "-m", "memoryhub.runner"], cwd=BASE_DIR,
                            env=dict(os.environ, **{variable: value}), capture_output=True, text=True, timeout=60)
    assert runner.returncode == 2
    assert "configuration error" in runner.stdout and variable in runner.stdout
    assert "Traceback" not in runner.stdout + runner.stderr
    # The runner's own; the rest are Django settings.
    if variable not in ("PORT", "WORKER_CPU_NICE", "WORKER_CPU_IDLE", "EMBEDDING_CATCH_UP_SECONDS"):
        check = _django_check(**{variable: value})
        assert check.returncode != 0
        assert f"configuration error: {variable}" in check.stderr
        assert "Traceback" not in check.stderr


def test_good_environment_passes_django_checks() -> None:
    result = _django_check()
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
