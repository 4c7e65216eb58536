"""The encryption key kept in the data dir (memoryhub/secrets.py, memoryhub/encryption.py): on
`make run`'s defaults — no MEMORYHUB_ENCRYPTION_KEYS, not production — a fresh data dir gets a
random key beside the other generated secrets, kept 0600 and reused, never shown; it seals until
keys are configured and then only opens. Production and the test suite never keep one: production
seals with configured keys or refuses, as before."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from memoryhub.encryption import DEV_KEY_ID, LOCAL_KEY_ID, EncryptionUnavailable, keyring_from_environment, seal
from memoryhub.secrets import VARIABLES, load_secrets

pytestmark = pytest.mark.slow  # settings processes

BASE_DIR = Path(__file__).resolve().parents[2]
K1 = "11" * 32
# What `make run` starts without: no secret, no key, no test-suite marker, no DEBUG.
NOT_INHERITED = [*VARIABLES.values(), "API_KEY_PEPPER_PREVIOUS", "MEMORYHUB_TEST_SUITE", "MEMORYHUB_PRODUCTION",
                 "MEMORYHUB_ENCRYPTION_KEYS", "DEBUG"]


def _kept_hex(data_dir: Path) -> str:
    return str(json.loads((data_dir / "secrets.json").read_text())["encryption_key"])


def test_a_fresh_data_dir_gets_an_encryption_key_kept_0600_reused_and_never_shown(tmp_path: Path) -> None:
    first = load_secrets(tmp_path, production=False, environ={})
    assert first.encryption_key is not None and len(first.encryption_key) == 32
    kept = _kept_hex(tmp_path)
    assert bytes.fromhex(kept) == first.encryption_key
    assert stat.S_IMODE((tmp_path / "secrets.json").stat().st_mode) == 0o600
    assert load_secrets(tmp_path, production=False, environ={}).encryption_key == first.encryption_key  # reused
    keyring = keyring_from_environment({}, secret_key=first.secret_key, development=False,
                                       kept_key=first.encryption_key)
    assert keyring.current_id == LOCAL_KEY_ID
    assert seal(b"workspace", associated_data=b"x", keyring=keyring)[0] == LOCAL_KEY_ID
    for shown in (repr(first), repr(keyring), str(first)):
        assert kept not in shown and kept.upper() not in shown


def test_with_keys_configured_none_is_made_and_a_kept_one_only_opens(tmp_path: Path) -> None:
    configured = {"MEMORYHUB_ENCRYPTION_KEYS": f"k1:{K1}"}
    assert load_secrets(tmp_path, production=False, environ=configured).encryption_key is None
    assert "encryption_key" not in json.loads((tmp_path / "secrets.json").read_text())
    kept = load_secrets(tmp_path, production=False, environ={}).encryption_key  # a start before the keys were set
    later = load_secrets(tmp_path, production=False, environ=configured)
    assert later.encryption_key == kept
    keyring = keyring_from_environment(configured, secret_key=later.secret_key, development=False,
                                       kept_key=later.encryption_key)
    assert keyring.current_id == "k1" and set(keyring.ids) == {"k1", LOCAL_KEY_ID}
    # In DEBUG the kept key seals before the derived development key, which still opens.
    debug = keyring_from_environment({}, secret_key=later.secret_key, development=True, kept_key=kept)
    assert debug.current_id == LOCAL_KEY_ID and set(debug.ids) == {LOCAL_KEY_ID, DEV_KEY_ID}
    with pytest.raises(ImproperlyConfigured, match="reserved"):
        keyring_from_environment({"MEMORYHUB_ENCRYPTION_KEYS": f"{LOCAL_KEY_ID}:{K1}"}, secret_key="s" * 50,
                                 development=False)


def test_production_and_the_test_suite_keep_no_encryption_key(tmp_path: Path) -> None:
    chosen = {variable: f"{variable.lower()}-" + "x" * 40 for variable in VARIABLES.values()}
    production = load_secrets(tmp_path, production=True, environ=chosen)
    assert production.encryption_key is None and not list(tmp_path.iterdir())
    keyring = keyring_from_environment(chosen, secret_key=production.secret_key, development=False,
                                       kept_key=production.encryption_key)
    with pytest.raises(EncryptionUnavailable):  # today's rule: configured keys or no sealing at all
        seal(b"workspace", associated_data=b"x", keyring=keyring)
    suite = load_secrets(tmp_path, production=False, environ={"MEMORYHUB_TEST_SUITE": "1"})
    assert suite.encryption_key is None and not list(tmp_path.iterdir())


def test_a_damaged_kept_key_stops_the_start_without_echoing_it(tmp_path: Path) -> None:
    load_secrets(tmp_path, production=False, environ={})
    stored = json.loads((tmp_path / "secrets.json").read_text())
    damaged = stored["encryption_key"][:-2] + "zz"
    (tmp_path / "secrets.json").write_text(json.dumps({**stored, "encryption_key": damaged}))
    with pytest.raises(ImproperlyConfigured, match="'encryption_key' must be 64 hex characters") as raised:
        load_secrets(tmp_path, production=False, environ={})
    assert damaged not in str(raised.value) and damaged[:16] not in str(raised.value)


def _settings_keyring(data_dir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """Settings loaded as `make run`'s processes load them (the runner imports them first, then
    starts web, worker and beat on the same data dir): which key seals?"""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(MEMORYHUB_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="memoryhub.settings", **extra)
    code = "from django.conf import settings; print(settings.ENCRYPTION_KEYRING.current_id)"
    return subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_make_run_settings_on_a_fresh_data_dir_seal_with_the_kept_key(tmp_path: Path) -> None:
    """`make run`'s settings on a fresh data dir generate and keep a sealing key (so teleport uploads
    are sealed, not refused with 503 encryption_unavailable); production settings generate none."""
    data_dir = tmp_path / "var"
    first = _settings_keyring(data_dir)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == LOCAL_KEY_ID
    kept = _kept_hex(data_dir)
    assert kept not in first.stdout + first.stderr  # nothing prints it
    assert _settings_keyring(data_dir).stdout.strip() == LOCAL_KEY_ID and _kept_hex(data_dir) == kept
    # Production on the same machine generates nothing and seals with nothing (no key configured).
    secrets = {variable: f"{variable.lower()}-" + "p" * 40 for variable in VARIABLES.values()}
    production = _settings_keyring(tmp_path / "prod", MEMORYHUB_PRODUCTION="true", **secrets)
    assert production.returncode == 0, production.stderr
    assert production.stdout.strip() == "None"
    assert not (tmp_path / "prod" / "secrets.json").exists()
