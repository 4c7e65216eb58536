"""The service's secrets (docs/operations.md §4). Outside the test suite no committed value is accepted: a fresh data
dir gets random secrets (kept 0600, reused), and a token signed with the repository's development
key is refused by a real service process. JWT signing key and API-key pepper are separate and
rotate separately (memoryhub/secrets.py, docs/operations.md §4)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from io import StringIO
from pathlib import Path

import httpx
import jwt
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from rest_framework.response import Response

from accounts.authentication import access_token_for_key
from accounts.models import ApiKey
from memoryhub.embedded import free_port
from memoryhub.secrets import DEV_SECRETS, VARIABLES, load_secrets, rotate_kept_secret
from tests.factories import bearer_client, database_url_for_processes, make_key, make_org, make_stack, wait_for_health

BASE_DIR = Path(__file__).resolve().parents[2]
SECRET_VARIABLES = [*VARIABLES.values(), "API_KEY_PEPPER_PREVIOUS", "MEMORYHUB_TEST_SUITE", "MEMORYHUB_PRODUCTION"]


def outside_the_test_suite(**extra: str) -> dict[str, str]:
    """An environment as a service started by `make run` would have it: no secret variables and
    no test-suite marker."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    env.update(extra)
    return env


def test_a_fresh_data_dir_gets_random_secrets_kept_0600_and_reused(tmp_path: Path) -> None:
    first = load_secrets(tmp_path, production=False, environ={})
    values = [first.secret_key, first.jwt_signing_key, first.api_key_pepper]
    assert len(set(values)) == 3 and all(len(v) >= 48 for v in values)
    assert not set(values) & set(DEV_SECRETS.values())
    kept = tmp_path / "secrets.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert load_secrets(tmp_path, production=False, environ={}) == first  # the next start reuses them
    assert json.loads(kept.read_text())["jwt_signing_key"] == first.jwt_signing_key


def test_processes_starting_together_agree_on_one_set_of_secrets(tmp_path: Path) -> None:
    """Web, worker and beat start at once: the file is created once, under a lock, atomically."""
    code = ("import sys; from pathlib import Path; from memoryhub.secrets import load_secrets; "
            "s = load_secrets(Path(sys.argv[1]), production=False, environ={}); "
            "print(s.secret_key, s.jwt_signing_key, s.api_key_pepper)")
    processes = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=BASE_DIR, text=True,
                                  stdout=subprocess.PIPE, env=outside_the_test_suite()) for _ in range(6)]
    outputs = {process.communicate(timeout=60)[0] for process in processes}
    assert len(outputs) == 1 and len(outputs.pop().split()) == 3
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["secrets.json"]


@pytest.mark.parametrize("name", list(VARIABLES))
def test_a_committed_development_value_is_refused_outside_the_test_suite(tmp_path: Path, name: str) -> None:
    variable = VARIABLES[name]
    with pytest.raises(ImproperlyConfigured, match=variable):
        load_secrets(tmp_path, production=False, environ={variable: DEV_SECRETS[name]})
    # (DEV_SECRETS["secret_key"] is the SECRET_KEY every earlier release used by default.)
    with pytest.raises(ImproperlyConfigured, match=variable):
        load_secrets(tmp_path, production=False, environ={variable: DEV_SECRETS["secret_key"]})
    accepted = load_secrets(tmp_path, production=False,
                            environ={variable: DEV_SECRETS[name], "MEMORYHUB_TEST_SUITE": "1"})
    assert getattr(accepted, name) == DEV_SECRETS[name]


def test_the_test_suite_runs_on_the_development_values_and_writes_no_file(tmp_path: Path) -> None:
    secrets = load_secrets(tmp_path, production=False, environ={"MEMORYHUB_TEST_SUITE": "1"})
    assert (secrets.secret_key, secrets.jwt_signing_key, secrets.api_key_pepper) == tuple(DEV_SECRETS.values())
    assert not list(tmp_path.iterdir())
    assert DEV_SECRETS["jwt_signing_key"] == settings.JWT_SIGNING_KEY  # this very session
    with pytest.raises(ImproperlyConfigured, match="MEMORYHUB_TEST_SUITE"):
        load_secrets(tmp_path, production=True, environ={"MEMORYHUB_TEST_SUITE": "1"})


def test_production_needs_all_three_from_the_environment_and_keeps_no_file(tmp_path: Path) -> None:
    chosen = {variable: f"{variable.lower()}-" + "x" * 40 for variable in VARIABLES.values()}
    for missing in VARIABLES.values():
        with pytest.raises(ImproperlyConfigured, match=f"{missing} must be set when MEMORYHUB_PRODUCTION=true"):
            load_secrets(tmp_path, production=True, environ={k: v for k, v in chosen.items() if k != missing})
    secrets = load_secrets(tmp_path, production=True, environ=chosen)
    assert secrets.jwt_signing_key == chosen["JWT_SIGNING_KEY"] and not list(tmp_path.iterdir())
    with pytest.raises(ImproperlyConfigured, match="JWT_SIGNING_KEY must be at least 32"):
        load_secrets(tmp_path, production=True, environ={**chosen, "JWT_SIGNING_KEY": "short"})


def test_a_secrets_file_others_can_read_is_refused(tmp_path: Path) -> None:
    load_secrets(tmp_path, production=False, environ={})
    (tmp_path / "secrets.json").chmod(0o644)
    with pytest.raises(ImproperlyConfigured, match="readable by other users"):
        load_secrets(tmp_path, production=False, environ={})


def test_rotating_one_secret_leaves_the_others_and_a_rotated_pepper_stays_accepted(tmp_path: Path) -> None:
    before = load_secrets(tmp_path, production=False, environ={})
    rotate_kept_secret(tmp_path, "jwt_signing_key")
    after_jwt = load_secrets(tmp_path, production=False, environ={})
    assert after_jwt.jwt_signing_key != before.jwt_signing_key
    assert (after_jwt.secret_key, after_jwt.api_key_pepper) == (before.secret_key, before.api_key_pepper)
    rotate_kept_secret(tmp_path, "api_key_pepper")
    after_pepper = load_secrets(tmp_path, production=False, environ={})
    assert after_pepper.api_key_pepper != before.api_key_pepper
    assert after_pepper.previous_api_key_peppers == (before.api_key_pepper,)
    assert after_pepper.jwt_signing_key == after_jwt.jwt_signing_key
    assert stat.S_IMODE((tmp_path / "secrets.json").stat().st_mode) == 0o600


@pytest.mark.django_db
def test_a_key_issued_under_a_previous_pepper_works_and_is_rehashed_on_use(tmp_path: Path) -> None:
    org = make_org()
    key, secret = make_key(org, stack=make_stack(org, "s1"))
    old_hash = key.key_hash
    with override_settings(API_KEY_PEPPER="a-new-pepper-" + "n" * 40, API_KEY_PEPPERS_PREVIOUS=()):
        assert _get(secret).status_code == 401  # without the window the key is unknown
    with override_settings(API_KEY_PEPPER="a-new-pepper-" + "n" * 40,
                           API_KEY_PEPPERS_PREVIOUS=(settings.API_KEY_PEPPER,)):
        assert _get(secret).status_code == 200
        key.refresh_from_db()
        assert key.key_hash != old_hash
        assert key.key_hash == hmac.new(b"a-new-pepper-" + b"n" * 40, secret.encode(), hashlib.sha256).hexdigest()
        assert _get(secret).status_code == 200


def _get(secret: str) -> Response:
    return bearer_client(secret).get("/api/v1/stacks/")


@pytest.mark.django_db
def test_rotate_secret_command_rotates_the_file_and_guards_the_end_of_a_pepper_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    before = load_secrets(tmp_path, production=False, environ={})
    org = make_org()
    key, _ = make_key(org)  # issued before the rotation, never used since
    with override_settings(DATA_DIR=tmp_path):
        call_command("rotate_secret", "api-key-pepper", stdout=StringIO())
        assert load_secrets(tmp_path, production=False, environ={}).previous_api_key_peppers == (
            before.api_key_pepper,)
        with pytest.raises(CommandError, match=key.public_id):
            call_command("rotate_secret", "end-pepper-window")
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=key.created_at.replace(year=2100))
        call_command("rotate_secret", "end-pepper-window", stdout=StringIO())
        assert load_secrets(tmp_path, production=False, environ={}).previous_api_key_peppers == ()
        monkeypatch.setenv("JWT_SIGNING_KEY", "j" * 40)
        with pytest.raises(CommandError, match="set in the environment"):
            call_command("rotate_secret", "jwt-signing-key")


# --- a real service process, outside the test suite ------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_service_outside_the_test_suite_refuses_tokens_signed_with_the_development_key(tmp_path: Path) -> None:
    """End to end: a uvicorn process on a fresh data dir with no secret in its
    environment (as `make run` starts it) refuses a correctly-claimed token signed with either
    committed development key, and accepts one signed with the key it generated and kept."""
    org = make_org()
    key, secret = make_key(org, stack=make_stack(org, "student-1"))
    claims = dict(access_token_for_key(key).payload)
    data_dir, port, log = tmp_path / "var", free_port(), tmp_path / "web.log"
    # The key above was hashed under the test suite's pepper; listing it as a previous pepper
    # also shows the rotation window at work in a real process.
    env = outside_the_test_suite(MEMORYHUB_DATA_DIR=str(data_dir), DATABASE_URL=database_url_for_processes(),
                                 API_KEY_PEPPER_PREVIOUS=settings.API_KEY_PEPPER)
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "memoryhub.asgi:application", "--host", "127.0.0.1", "--port",
             str(port), "--lifespan", "off", "--no-proxy-headers", "--no-access-log"],
            cwd=BASE_DIR, env=env, stdout=output, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(base_url, alive=lambda: process.poll() is None, log=log)
        kept = json.loads((data_dir / "secrets.json").read_text())
        assert stat.S_IMODE((data_dir / "secrets.json").stat().st_mode) == 0o600

        def status(credential: str) -> int:
            return httpx.get(f"{base_url}/api/v1/stacks/student-1/", timeout=10,
                             headers={"Authorization": f"Bearer {credential}"}).status_code

        for development_key in (DEV_SECRETS["jwt_signing_key"], DEV_SECRETS["secret_key"]):
            assert status(jwt.encode(claims, development_key, algorithm="HS256")) == 401
        assert status(jwt.encode(claims, kept["jwt_signing_key"], algorithm="HS256")) == 200
        assert status(secret) == 200
        key.refresh_from_db()
        assert key.key_hash == hmac.new(kept["api_key_pepper"].encode(), secret.encode(),
                                        hashlib.sha256).hexdigest()
    finally:
        process.terminate()
        process.wait(timeout=30)
    # Every later process on that data dir (`make run` again, manage.py) runs on the same secrets.
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            "from django.conf import settings; print(settings.JWT_SIGNING_KEY)"],
                           cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert shell.stdout.strip().splitlines()[-1] == kept["jwt_signing_key"], shell.stderr


def test_a_bad_trusted_proxies_value_stops_start_up_naming_it() -> None:
    check = subprocess.run([sys.executable, "manage.py", "check"], cwd=BASE_DIR, capture_output=True, text=True,
                           env=dict(os.environ, TRUSTED_PROXIES="10.0.0.0/8,not-a-network"), timeout=120)
    assert check.returncode != 0 and "TRUSTED_PROXIES" in check.stderr and "Traceback" not in check.stderr
