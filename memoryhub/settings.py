"""Django settings, read from the environment with safe development defaults.

Unset DATABASE_URL / REDIS_URL mean "the embedded servers that `make run` starts" (see
memoryhub/embedded.py): the ones it recorded in DATA_DIR/runtime.json while it runs, else their
default ports; set them to point at external PostgreSQL (with pgvector) and Redis.

One module over 500 lines on purpose: Django reads one settings module, and each setting sits
beside the check of its environment variable (docs/configuration.md lists them all).
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from csp import constants as csp_constants
from django.core.exceptions import ImproperlyConfigured

from memoryhub.chain_dev import read_chain_file
from memoryhub.encryption import keyring_from_environment
from memoryhub.environment import (
    data_dir,
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
    env_url,
    running_service,
    static_root,
)
from memoryhub.secrets import is_test_suite, load_secrets

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = data_dir()

DEBUG = env_bool("DEBUG", False)
# Three separate secrets (memoryhub/secrets.py; rotation: docs/operations.md §4): Django's own
# (sessions, CSRF), the JWT signing key and the API-key pepper. Each comes from its environment
# variable, else — outside the test suite — from <data dir>/secrets.json, generated on first start.
# The development values committed in the repository are accepted by the test suite only.
_SECRETS = load_secrets(DATA_DIR, production=env_bool("MEMORYHUB_PRODUCTION", False))
SECRET_KEY = _SECRETS.secret_key
JWT_SIGNING_KEY = _SECRETS.jwt_signing_key
API_KEY_PEPPER = _SECRETS.api_key_pepper
API_KEY_PEPPERS_PREVIOUS = _SECRETS.previous_api_key_peppers
# Encryption at rest (memoryhub/encryption.py; docs/privacy.md "Encryption at rest"): the keys in
# MEMORYHUB_ENCRYPTION_KEYS, parsed strictly here so a bad value stops the start. Without them, the
# key kept in <data dir>/secrets.json outside production (memoryhub/secrets.py), and a key derived
# from SECRET_KEY in the test suite: production seals with configured keys or not at all.
ENCRYPTION_KEYRING = keyring_from_environment(
    os.environ, secret_key=SECRET_KEY, kept_key=_SECRETS.encryption_key,
    development=(DEBUG or is_test_suite()) and not env_bool("MEMORYHUB_PRODUCTION", False))
# Redaction at ingest can be switched off for one thing only: bench/redaction.py measuring a push
# with and without it (MEMORYHUB_REDACTION=off next to MEMORYHUB_BENCH=1). Anywhere else the switch
# stops the start: never in production, never with secrets supplied by the environment (what a real
# deployment does) — only on development secrets (the test suite's, or <data dir>/secrets.json).
REDACTION_OFF_FOR_BENCH = env_choice("MEMORYHUB_REDACTION", "on", ("on", "off")) == "off"
if REDACTION_OFF_FOR_BENCH and (not env_bool("MEMORYHUB_BENCH", False) or env_bool("MEMORYHUB_PRODUCTION", False)
                                or any(os.environ.get(name) for name in ("SECRET_KEY", "JWT_SIGNING_KEY",
                                                                          "API_KEY_PEPPER"))):
    raise ImproperlyConfigured("MEMORYHUB_REDACTION=off is for benchmarks only (MEMORYHUB_BENCH=1 on development "
                               "secrets, never with MEMORYHUB_PRODUCTION); unset it.")
# The access log (docs/privacy.md "Access log") is on unless MEMORYHUB_ACCESS_LOG=false: bench/search.py and
# bench/load.py serve a second server without it, in the same run, to measure what it costs.
MEMORYHUB_ACCESS_LOG = env_bool("MEMORYHUB_ACCESS_LOG", True)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Embedded service ports, used only when DATABASE_URL / REDIS_URL are not set.
EMBEDDED_PG_PORT = env_int("MEMORYHUB_PG_PORT", 54320, minimum=1, maximum=65535)
EMBEDDED_REDIS_PORT = env_int("MEMORYHUB_REDIS_PORT", 63790, minimum=1, maximum=65535)

# While `make run` runs it records the embedded servers it started (their real ports) in
# DATA_DIR/runtime.json, so `manage.py …` in a second shell reaches that service without any
# exported variable; a file whose runner is gone is ignored. An explicit URL always wins.
RUNNING_SERVICE = running_service(DATA_DIR)
DATABASE_URL = env_url(
    "DATABASE_URL",
    RUNNING_SERVICE.get("database_url") or f"postgresql://postgres@127.0.0.1:{EMBEDDED_PG_PORT}/memoryhub",
    ("postgres", "postgresql", "pgsql"),
)
REDIS_URL = env_url(
    "REDIS_URL",
    RUNNING_SERVICE.get("redis_url") or f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0",
    ("redis", "rediss", "unix"),
)

# Under ASGI every request may run on another thread, so Django's persistent connections do not
# carry over and each request would open a new connection. A psycopg connection pool
# per process does: DB_POOL_MAX_SIZE=0 turns it off (then DB_CONN_MAX_AGE applies).
DB_POOL_MAX_SIZE = env_int("DB_POOL_MAX_SIZE", 10, minimum=0)
# How long a statement of this process waits for a row or table lock before it fails (PostgreSQL's
# lock_timeout; 0: without end). The runner gives it to its web processes only (10 s): a request is
# then answered 503 `busy` with Retry-After instead of hanging behind a stuck lock holder, while the
# worker's jobs and migrations may wait as long as they must (docs/operations.md §6 "Lock waits").
DB_LOCK_TIMEOUT_MS = env_int("DB_LOCK_TIMEOUT_MS", 0, minimum=0)


def _database(url: str) -> dict[str, Any]:
    """One DATABASES entry: the primary and the read replica get the same pool and timeouts."""
    database = dj_database_url.parse(
        url,
        conn_max_age=0 if DB_POOL_MAX_SIZE else env_int("DB_CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=not DB_POOL_MAX_SIZE,
    )
    options = database.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", 5)
    if DB_LOCK_TIMEOUT_MS:
        # A startup parameter: set once per connection, nothing sent per request.
        options["options"] = f"{options.get('options', '')} -c lock_timeout={DB_LOCK_TIMEOUT_MS}".strip()
    if DB_POOL_MAX_SIZE:
        options["pool"] = {
            "min_size": 1,
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": 5,  # waiting longer for a connection means the database is in trouble: fail (503)
        }
    return dict(database)


DATABASES = {"default": _database(DATABASE_URL)}
# Search's neighbouring-turn statement is prepared once per database session and run with a generic
# plan (memories/search/context.py, docs/algorithms.md §7.5 "Cost"). Off for a transaction-pooling
# PgBouncer in front of PostgreSQL, which does not carry one session's SQL-level PREPARE to the next.
DB_PREPARED_STATEMENTS = env_bool("DB_PREPARED_STATEMENTS", True)
# A search's deadline in the database (docs/algorithms.md §7.4): one stack's inside the kernle
# client's 3 s, a school-wide search's (every row of several stacks ranked exactly) longer.
SEARCH_STATEMENT_TIMEOUT_MS = env_int("SEARCH_STATEMENT_TIMEOUT_MS", 2_500, minimum=100)
SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS = env_int("SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS", 10_000, minimum=100)
# Timestamps are read with psycopg's compiled loader instead of Django's Python one (memoryhub.database,
# docs/operations.md §12); false puts Django's back.
DB_COMPILED_TIMESTAMPS = env_bool("DB_COMPILED_TIMESTAMPS", True)
# Web and worker processes freeze what they load at start out of the garbage collector's walks
# (memoryhub/interpreter.py); false leaves CPython's collector as it is.
PYTHON_GC_TUNING = env_bool("PYTHON_GC_TUNING", True)
# How long a web process's busy thread keeps the GIL from a thread whose database or Redis answer
# has come back (memoryhub/interpreter.py); CPython's own is 5.
PYTHON_GIL_SWITCH_MS = env_int("PYTHON_GIL_SWITCH_MS", 1, minimum=1, maximum=100)
# Each response says where its time went: app, cpu and db durations (memoryhub.timing).
SERVER_TIMING = env_bool("SERVER_TIMING", True)
# An optional streaming replica (docs/production.md §4): the read-only pages that can show data a
# moment old read it through memoryhub.replica.read_alias(); writes, access decisions, sync pull
# and anything inside a transaction stay on the primary. Unset: no "replica" alias is used at all.
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL", "")
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = _database(env_url("DATABASE_REPLICA_URL", "", ("postgres", "postgresql", "pgsql")))
elif is_test_suite():
    # The suite declares the alias as a test mirror of the primary (no database of its own, no
    # flush), so tests/memoryhub/test_replica.py can point it at a real standby; reads go to it
    # only when DATABASE_READ_ALIAS says so.
    DATABASES["replica"] = {**_database(DATABASE_URL), "TEST": {"MIRROR": "default"}}
DATABASE_READ_ALIAS = "replica" if DATABASE_REPLICA_URL else "default"

INSTALLED_APPS = [
    "memoryhub",  # the project package, for its operator commands (manage.py backup / restore)
    "accounts.apps.AdminConfig",  # django.contrib.admin with our site: the sign-in lockout on /admin/login/
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django.contrib.humanize",  # naturaltime: "now", "3 minutes ago" on the dashboard
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served by us: the API docs work offline
    "channels",
    "django_htmx",
    "csp",
    "accounts",
    "stacks",
    "memories",
    "billing",
    "teleport",
    "webhooks",
    "dashboard",
    "agents",  # MCP at /mcp (agents/mcp_server.py, mounted in memoryhub/asgi.py)
]

MIDDLEWARE = [
    # First: counts and times every request, whatever the middleware below answer (memoryhub.metrics).
    "memoryhub.metrics.MetricsMiddleware",
    # Where the request's time went, in its Server-Timing header (memoryhub.timing).
    "memoryhub.timing.ServerTimingMiddleware",
    # The request id on every log line of the request and of the tasks it queues (memoryhub.requestid).
    "memoryhub.requestid.RequestIdMiddleware",
    # Times interactive requests for the bulk lane's limit and frees a bulk request's place (memoryhub.lanes).
    "memoryhub.lanes.LaneMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files answer here, before sessions and CSRF, in every mode (memoryhub/staticfiles.py).
    "memoryhub.staticfiles.StaticFilesMiddleware",
    # Whole responses at RESPONSE_GZIP_LEVEL, streamed ones as Django does (memoryhub.compression).
    "memoryhub.compression.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The Content-Security-Policy below, built once (memoryhub.csp).
    "memoryhub.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Who was served which memories: collected during the request, written once the response is
    # sent (memories.reads.access_log; docs/privacy.md "Access log").
    "memories.reads.access_log.AccessLogMiddleware",
    # Last, so a view's exception reaches it first: a database or Redis failure in a view that is
    # not DRF's (the dashboard, sign-in) is the API's 503 with Retry-After, not a 500 (memoryhub.errors).
    "memoryhub.errors.ServiceUnavailableMiddleware",
]

ROOT_URLCONF = "memoryhub.urls"
ASGI_APPLICATION = "memoryhub.asgi.application"
AUTH_USER_MODEL = "accounts.User"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/login/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context.navigation",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The dashboard's front-end packages come from npm (package.json + package-lock.json, installed by
# `make install` into node_modules/) and are served by WhiteNoise like our own files: no CDN, so
# the dashboard works offline.
NODE_MODULES = BASE_DIR / "node_modules"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("vendor/htmx", NODE_MODULES / "htmx.org" / "dist"),
    ("vendor/chartjs", NODE_MODULES / "chart.js" / "dist"),
]
STATIC_ROOT = static_root(DATA_DIR)  # `make run` runs collectstatic into it at every start
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed (cache-busting) and gzip/brotli-compressed once collected; plain names before that.
    "staticfiles": {"BACKEND": "memoryhub.staticfiles.ManifestOrSourceStorage"},
}
# Nothing collected yet (the test session, a bare `manage.py runserver`): WhiteNoise serves the
# source directories instead, so pages are styled without a prior collectstatic.
WHITENOISE_USE_FINDERS = not (STATIC_ROOT / "staticfiles.json").is_file()

# Sync pushes carry up to 1,000 full records; the kernle contract needs at least 10 MB.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 16 * 1024 * 1024, minimum=1024 * 1024)
# Teleport (docs/teleport.md): ONE limit on a workspace snapshot, applied to the upload and to the
# bytes its gzip stream unpacks to (a zip-bomb guard); no larger than a request body may be.
TELEPORT_MAX_BYTES = env_int("TELEPORT_MAX_BYTES", 16 * 1024 * 1024, minimum=64 * 1024,
                             maximum=DATA_UPLOAD_MAX_MEMORY_SIZE)
TELEPORT_DIR = DATA_DIR / "teleport"  # sealed snapshot blobs, content-addressed (teleport/blobs.py)
# An S3-compatible bucket instead of TELEPORT_DIR when a bucket is named (docs/teleport.md §3). The
# endpoint is for MinIO, R2, Ceph and the like (unset: AWS S3). Credentials come the standard AWS way
# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY env vars, a profile or an instance role), never from here.
TELEPORT_S3_BUCKET = env_str("TELEPORT_S3_BUCKET", "")
if TELEPORT_S3_BUCKET and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", TELEPORT_S3_BUCKET):
    raise ImproperlyConfigured(f"TELEPORT_S3_BUCKET must be a bucket name (3-63 of a-z 0-9 . -), "
                               f"got {TELEPORT_S3_BUCKET!r}")
TELEPORT_S3_ENDPOINT_URL = env_url("TELEPORT_S3_ENDPOINT_URL", "", ("http", "https")) \
    if env_str("TELEPORT_S3_ENDPOINT_URL", "") else ""
TELEPORT_S3_REGION = env_str("TELEPORT_S3_REGION", "")
DATA_UPLOAD_MAX_NUMBER_FIELDS = 10_000
# Bodies of the routes anyone may call (register, logins) and of requests with no credential;
# both limits are enforced before the body is read (memoryhub/limits.py).
MAX_UNAUTHENTICATED_REQUEST_BYTES = env_int("MAX_UNAUTHENTICATED_REQUEST_BYTES", 64 * 1024, minimum=4096)

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy (django-csp's format; set by memoryhub.csp) on every response: scripts,
# styles and everything else only from our own origin — no inline script or style, no CDN. The
# dashboard's charts read their data from <script type="application/json"> blocks (json_script),
# which CSP does not execute.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [csp_constants.SELF],
        "script-src": [csp_constants.SELF],
        "style-src": [csp_constants.SELF],
        "img-src": [csp_constants.SELF, "data:"],
        "connect-src": [csp_constants.SELF],
        "font-src": [csp_constants.SELF],
        "object-src": [csp_constants.NONE],
        "base-uri": [csp_constants.SELF],
        "form-action": [csp_constants.SELF],
        "frame-ancestors": [csp_constants.NONE],
    },
}

# Dashboard mail (invitations, password resets): printed to the console by default; SMTP when
# EMAIL_HOST is set (EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS).
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_BACKEND = ("django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST
                 else "django.core.mail.backends.console.EmailBackend")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "MemoryHub <no-reply@memoryhub.localhost>")
# Password-reset links last an hour.
PASSWORD_RESET_TIMEOUT = 3600

# Webhooks (webhooks/): endpoints must be https. Plain http to 127.0.0.1/localhost is allowed only
# with DEBUG or this switch (the test suite sets it; receivers on the same machine in development).
WEBHOOKS_ALLOW_LOOPBACK_HTTP = env_bool("WEBHOOKS_ALLOW_LOOPBACK_HTTP", False)
# /metrics (Prometheus): readable with `Authorization: Bearer $METRICS_TOKEN`; without a token, only
# from loopback and not through a proxy (memoryhub.metrics).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# Payments in USDC, checked on the chain itself (billing/chain/; docs/billing.md §3).
# Production: Base mainnet — CHAIN_RPC_URL of a Base node, CHAIN_ID 8453, USDC_CONTRACT defaults to
# Base's USDC there, TREASURY_ADDRESS your receiving wallet, CHAIN_RELAYER_KEY the key that submits
# agents' x402 authorizations (it pays their gas; keep little ETH on it). Unset CHAIN_RPC_URL means
# the development chain `make run` starts and records in <data dir>/chain.json (never in the test
# suite, whose fixtures set these). No RPC or no treasury: billing answers 503, it never guesses.
BASE_USDC_CONTRACT = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
_DEV_CHAIN = {} if os.environ.get("CHAIN_RPC_URL") or is_test_suite() else read_chain_file(DATA_DIR)
CHAIN_RPC_URL = env_str("CHAIN_RPC_URL", _DEV_CHAIN.get("rpc_url", ""))
if CHAIN_RPC_URL and not CHAIN_RPC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"CHAIN_RPC_URL must be an http(s) URL, got {CHAIN_RPC_URL!r}")
CHAIN_ID = env_int("CHAIN_ID", int(_DEV_CHAIN.get("chain_id", 8453)), minimum=1)
USDC_CONTRACT = env_str("USDC_CONTRACT",
                        _DEV_CHAIN.get("usdc_contract") or (BASE_USDC_CONTRACT if CHAIN_ID == 8453 else ""))
TREASURY_ADDRESS = env_str("TREASURY_ADDRESS", _DEV_CHAIN.get("treasury", ""))
for _name, _address in (("USDC_CONTRACT", USDC_CONTRACT), ("TREASURY_ADDRESS", TREASURY_ADDRESS)):
    # The legacy default treasury was the zero address, which would count burns as payments.
    if _address and (not re.fullmatch(r"0x[0-9a-fA-F]{40}", _address) or int(_address, 16) == 0):
        raise ImproperlyConfigured(f"{_name} must be a non-zero 0x-prefixed 20-byte address, got {_address!r}")
PAYMENT_CONFIRMATIONS = env_int("PAYMENT_CONFIRMATIONS", 10, minimum=1)
CHAIN_RELAYER_KEY = env_str("CHAIN_RELAYER_KEY", _DEV_CHAIN.get("relayer_key", ""))
CHAIN_LOG_RANGE = env_int("CHAIN_LOG_RANGE", 2000, minimum=1)  # blocks per eth_getLogs (providers cap it)
CHAIN_RPC_TIMEOUT_SECONDS = env_int("CHAIN_RPC_TIMEOUT_SECONDS", 10, minimum=1)
CHAIN_EXPLORER_URL = env_str("CHAIN_EXPLORER_URL", "https://basescan.org" if CHAIN_ID == 8453 else "")
# Subscriptions (billing/services/payments.py): a confirmed payment is watched for reorgs until this deep
# (0: twice PAYMENT_CONFIRMATIONS). SIWE wallet links must be signed for SIWE_DOMAIN (empty: the
# request's own host, which ALLOWED_HOSTS already vets).
PAYMENT_FINALITY_CONFIRMATIONS = env_int("PAYMENT_FINALITY_CONFIRMATIONS", 0, minimum=0)
SIWE_DOMAIN = env_str("SIWE_DOMAIN", "")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "mh",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": "mh:channels"},
    }
}

# Celery: broker and results in Redis. Tasks are acknowledged late so a killed worker's task is
# redelivered; every task is written to be idempotent.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 300
CELERY_TASK_TIME_LIMIT = 360
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "socket_connect_timeout": 2}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# A worker process per core by default, as `make run` sizes it (memoryhub/runner.py, docs/production.md §2).
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
CELERY_WORKER_CONCURRENCY = env_int("CELERY_CONCURRENCY", _CORES, minimum=1)

THROTTLE_REQUEST_RATE = env_str("THROTTLE_REQUEST_RATE", "1200/min")  # per credential (or IP, anonymous)
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "memoryhub.errors.api_exception_handler",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerAuthentication",
        "accounts.authentication.SessionPrincipalAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSONRenderer with orjson doing the encoding: same bytes, a fraction of the CPU (memoryhub/renderers.py).
    "DEFAULT_RENDERER_CLASSES": ["memoryhub.renderers.FastJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["memoryhub.limits.BoundedJSONParser"],  # body cap, depth, string bounds
    "UNAUTHENTICATED_USER": None,
    # Redis-backed, fail closed (accounts/throttles.py). Views with their own limits (register,
    # login, key create/cycle, sync push/pull) attach the scoped pairs from accounts.throttles.
    # Authenticated requests count per credential and per school, never per client IP.
    "DEFAULT_THROTTLE_CLASSES": ["accounts.throttles.RequestRateThrottle", "accounts.throttles.SchoolThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "request": THROTTLE_REQUEST_RATE,
        "register": "5/min",
        "login": "30/min",
        "key_create": "10/min",
        "sync_push": "60/min",
        "sync_pull": "60/min",
        "subscription_upgrade": "5/min",  # billing routes (docs/kernle-protocol.md §12.3)
        "subscription_downgrade": "5/min",
        "subscription_cancel": "5/min",
        "subscription_reactivate": "5/min",
        "payment_confirm": "10/min",
        "wallet_link": "10/min",  # SIWE nonce and link
    },
}
# A school's share of the service (accounts/throttles.py SchoolThrottle): all authenticated
# requests of one organization — every key, token and dashboard user — per window. Generous by
# default (20 keys at the per-credential request rate), so it bounds one school, not one student.
_request_count, _request_period = THROTTLE_REQUEST_RATE.split("/")
THROTTLE_SCHOOL_RATE = env_str("THROTTLE_SCHOOL_RATE", f"{20 * int(_request_count)}/{_request_period}")

# Two lanes (memoryhub.lanes, docs/architecture.md §5.7): per web process, at most LANES_MAX_BULK
# bulk requests (pushes of LANES_BULK_BYTES or more, full pulls, exports) at once, fewer - down to
# one for LANES_MIN_BULK_PERCENT of the time - while interactive requests run over
# LANES_TOLERANCE_PERCENT of their unloaded latency; LANES_QUEUE wait
# up to LANES_MAX_WAIT_SECONDS, the rest are answered 503 / 429 with Retry-After.
LANES_ENABLED = env_bool("MEMORYHUB_LANES", True)
LANES_MIN_BULK = env_int("LANES_MIN_BULK_PERCENT", 75, minimum=1, maximum=100) / 100  # under 1: a share of the time
LANES_MAX_BULK = env_int("LANES_MAX_BULK", 2, minimum=1)
LANES_TOLERANCE = env_int("LANES_TOLERANCE_PERCENT", 150, minimum=110) / 100
LANES_QUEUE = env_int("LANES_QUEUE", 8, minimum=0)
LANES_MAX_WAIT_SECONDS = env_int("LANES_MAX_WAIT_SECONDS", 2, minimum=0)
LANES_BULK_BYTES = env_int("LANES_BULK_BYTES", 32 * 1024, minimum=1)
# While a bulk request runs, its thread and its PostgreSQL backend run at this CPU niceness
# (memoryhub.cpu_priority; 0: off).
LANES_BULK_NICE = env_int("LANES_BULK_NICE", 10, minimum=0, maximum=19)
# An interactive request still waiting for a thread after this long is answered 503 with
# Retry-After instead of being served after its client has given up (memoryhub.asgi).
LANES_INTERACTIVE_DEADLINE_SECONDS = env_int("LANES_INTERACTIVE_DEADLINE_SECONDS", 10, minimum=1)

SPECTACULAR_SETTINGS = {
    "TITLE": "MemoryHub API",
    "DESCRIPTION": (
        "A memory cloud for AI agents: stratified per-student memory stacks, the Kernle sync "
        "protocol, hybrid search and budget-aware load."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from our own static files (drf-spectacular-sidecar), never a CDN: MemoryHub must
    # work without internet. No validator either: Swagger UI would send the schema to swagger.io.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

SIMPLE_JWT = {
    "ACCESS_TOKEN_LIFETIME": timedelta(seconds=env_int("JWT_ACCESS_SECONDS", 7 * 24 * 3600, minimum=60)),
    "ALGORITHM": "HS256",
    "SIGNING_KEY": JWT_SIGNING_KEY,
    "USER_ID_FIELD": "public_id",
    "USER_ID_CLAIM": "user_id",
}

# The embedding model, read the same way by the web server, the workers and every management
# command: MiniLM unless set (the test suite pins `hash`, tests/plugin_embedded.py). The deployment
# records the one model its vectors are of; a process set for another one writes no vector
# (memories.search.embedding_model, docs/algorithms.md §10.3).
EMBEDDING_PROVIDER = env_choice("EMBEDDING_PROVIDER", "minilm", ("hash", "minilm", "openai"))
# How `minilm` runs (memories/search/embeddings.py, docs/algorithms.md §10.1): ONNX Runtime over the
# int8 export made by `make install` (the default; a model id of its own), the fp32 export (torch's
# vectors and model id), or torch itself. A missing export falls back to torch, with a warning.
MINILM_RUNTIME = env_choice("MINILM_RUNTIME", "onnx-int8", ("onnx-int8", "onnx", "torch"))
MINILM_ONNX_DIR = Path(env_str("MINILM_ONNX_DIR", str(BASE_DIR / "build" / "models" / "all-MiniLM-L6-v2")))
# The school overview says that search by meaning is behind once its stacks' recent time to
# searchable (p95, or a memory still waiting) reaches this many seconds (dashboard.overview,
# docs/algorithms.md §10.2.3).
TIME_TO_SEARCHABLE_ATTENTION_SECONDS = env_int("TIME_TO_SEARCHABLE_ATTENTION_SECONDS", 120, minimum=1)

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
# "json" for a log pipeline (the default with MEMORYHUB_PRODUCTION), "plain" for a terminal.
LOG_FORMAT = env_choice("LOG_FORMAT", "json" if env_bool("MEMORYHUB_PRODUCTION", False) else "plain",
                        ("plain", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # SafeFormatter: a logged database error's message (which may quote a stored row) is withheld
    # (memoryhub/logsafety.py). No memory text in logs: messages name ids, types and counts only.
    # LOG_FORMAT=json: one JSON object per line for a log pipeline; both carry the request id, which
    # follows a request into the Celery tasks it queued (memoryhub/requestid.py).
    "formatters": {"plain": {"()": "memoryhub.logsafety.SafeFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"},
                   "json": {"()": "memoryhub.logsafety.SafeJsonFormatter",
                            "format": "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
                            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"}}},
    "filters": {"withhold_database_errors": {"()": "memoryhub.logsafety.WithholdDatabaseErrors"},
                "request_id": {"()": "memoryhub.requestid.RequestIdFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT,
                             "filters": ["withhold_database_errors", "request_id"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # httpx logs every request's full URL at INFO: a webhook receiver's URL may carry a token in its
    # query string, and no secret goes into our logs.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"},
                "httpcore": {"level": "WARNING"},
                # The MCP transport logs a line per stateless request at INFO; its warnings (a refused
                # Host or Origin) still show.
                "mcp": {"level": "WARNING"},
                # At DEBUG botocore logs each signed request's headers, session token included
                # (the teleport bucket, teleport/blobs.py): never, whatever LOG_LEVEL says.
                "botocore": {"level": "WARNING"}, "boto3": {"level": "WARNING"},
                "s3transfer": {"level": "WARNING"}},
}

# OpenAI-compatible embeddings endpoint (EMBEDDING_PROVIDER=openai); it must return 384 dimensions.
EMBEDDING_API_URL = env_str("EMBEDDING_API_URL", "")
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY", "")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "text-embedding-3-small")

# Proxies whose X-Forwarded-For we believe (CIDRs; accounts/network.py). None by default: any
# client on a school network could otherwise name itself another address in the header and
# escape the per-IP limits. Set it to the reverse proxies' / load balancers' addresses.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
for _proxy in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(f"TRUSTED_PROXIES must be comma-separated networks (CIDR), got {_proxy!r}") from None

# What failed authentications cost (accounts/throttles.py FailureLimit): (failures, per seconds,
# first block seconds); a repeated block doubles, up to an hour. Bearer credentials per client IP
# (the IP is then refused outright) and per API-key prefix (failing guesses at that prefix get 429;
# the real key keeps working); dashboard sign-ins per account name and per client IP.
AUTH_FAILURE_LIMITS = {
    "bearer_ip": (50, 600, 300),
    "bearer_prefix": (10, 600, 600),
    "login_account": (10, 900, 900),
    "login_ip": (30, 900, 900),
}
# How long a web process remembers an API key that verified (accounts/key_cache.py): any change to
# keys, people, schools, memberships or teacher assignments invalidates it at once everywhere; this
# only bounds writes that bypass model signals (none of ours takes access away: docs/operations.md
# §5 "Key cache"), so it is sized for the quiet agent: one that calls every few seconds should not
# pay the lookup every few calls. 0 turns the cache off.
AUTH_KEY_CACHE_SECONDS = env_int("AUTH_KEY_CACHE_SECONDS", 60, minimum=0)
# The gzip level of whole responses (memoryhub.compression); 0: the proxy compresses, or nothing does.
RESPONSE_GZIP_LEVEL = env_int("RESPONSE_GZIP_LEVEL", 1, minimum=0, maximum=9)

# Name the "kind" enums explicitly: several components have a field called "kind".
SPECTACULAR_SETTINGS.setdefault("ENUM_NAME_OVERRIDES", {}).update({  # type: ignore[attr-defined]
    "StackKindEnum": "stacks.models.Stack.Kind",
    "MemoryKindEnum": "memories.models.MemoryKind",
    "PaymentResultStatusEnum": "billing.api.PAYMENT_RESULT_STATUSES",
    "ConsentActionEnum": "stacks.models.StackConsent.Action",
    "ConsentMethodEnum": "stacks.models.StackConsent.Method",
})
