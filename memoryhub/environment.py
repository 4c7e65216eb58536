"""Typed reads of the process environment for settings.

Every setting that comes from the environment goes through one of these readers, so a bad value
stops start-up with a message that names the variable instead of failing later somewhere deep.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value in (None, "") else value  # type: ignore[return-value]


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = _raw(name)
    if value in (None, ""):
        return default
    try:
        number = int(value)  # type: ignore[arg-type]
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {number}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value in (None, ""):
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]  # type: ignore[union-attr]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_url(name: str, default: str, schemes: tuple[str, ...]) -> str:
    value = env_str(name, default)
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name} must be a URL with scheme {' or '.join(schemes)}, got {value!r}"
        )
    return value


def data_dir() -> Path:
    """Where embedded services keep their data (./var unless MEMORYHUB_DATA_DIR says otherwise)."""
    base = Path(__file__).resolve().parent.parent
    return Path(env_str("MEMORYHUB_DATA_DIR", str(base / "var"))).resolve()


def static_root(data: Path) -> Path:
    """Where collectstatic writes: DATA_DIR/staticfiles unless MEMORYHUB_STATIC_ROOT says otherwise
    (a directory several data dirs or a web server share: a start reuses its compressed files)."""
    return Path(env_str("MEMORYHUB_STATIC_ROOT", str(data / "staticfiles"))).resolve()


def runtime_file(data: Path) -> Path:
    """Where `make run` records what it started (memoryhub/runner.py writes it, removes it on exit)."""
    return data / "runtime.json"


def _is_live_runner(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, but another user's: its command line (below) still tells whether it is ours
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (not Linux): a live pid is the best evidence there is
    # After a crash or reboot the pid may belong to some other program now: that file is stale too.
    return b"memoryhub.runner" in cmdline


def running_service(data: Path) -> dict[str, Any]:
    """What the runner serving from `data` recorded about itself, or {} when none is running.

    A file left behind by a runner that is gone (killed with SIGKILL, a reboot) is ignored.
    """
    try:
        info = json.loads(runtime_file(data).read_text())
        alive = isinstance(info, dict) and _is_live_runner(int(info["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return info if alive else {}
