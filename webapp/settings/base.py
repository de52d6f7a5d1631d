"""Settings shared by every situation; everything that varies comes from the environment.

Two topologies, chosen by which variables are set:

- embedded (``REDIS_URL`` and ``DATABASE_URL`` unset): SQLite, Channels' in-memory layer and a
  Celery worker fed by kombu's filesystem transport, results in files; all state lives under
  ``var/``, so a laptop needs no server.
- shared (``DATABASE_URL`` and ``REDIS_URL`` set): PostgreSQL, Redis as Celery broker and result
  store and as the channel layer, so several web and worker processes on several machines
  cooperate.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

VAR_DIR = Path(env.str("EDGEPIPE_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()


def private_dir(path: Path) -> None:
    """Create ``path`` (var/, the database's directory) readable by this user only (0700):
    the database, the sessions, queued tasks and uploaded weights live there. A directory that
    exists is left as it is (EDGEPIPE_VAR_DIR may name a shared one)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def private_file(path: Path) -> None:
    """Create ``path`` empty and readable by this user only (0600); if it exists, take away
    group's and others' access (when it is this user's file)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            with contextlib.suppress(PermissionError):  # another user's: theirs to protect
                path.chmod(mode & ~0o077)


SECRET_KEY = env.str("SECRET_KEY", default="")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "webapp.devices",
    "webapp.runs",
    "webapp.split",
    "webapp.dashboard",
    "webapp.gateway",
    "webapp.demo",
    "webapp.accounts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # the project's templates (templates/<app>/...); the apps' own directories only for
        # the third-party apps' (admin, DRF, drf-spectacular)
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --------------------------------------------------------------------------- database

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if DATABASES["default"]["NAME"] != ":memory:":
        private_dir(Path(DATABASES["default"]["NAME"]).parent)
    # The web process and the worker write to one file: take the write lock when a transaction
    # begins (no deadlock between two readers upgrading), wait for it rather than fail, and let
    # readers proceed during a write.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
# Keep connections open between requests: every request and every agent message opened one,
# and connecting showed in profiles of the web process while agents trained.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# the project's static files (static/<app>/...), the third-party apps' own, and plotly.js from
# the pinned plotly package (vendor/plotly.min.js: webapp.common.staticfinders)
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "webapp.common.staticfinders.PackageFileFinder",
]
STATIC_ROOT = env.str("STATIC_ROOT", default=str(VAR_DIR / "static"))
# The ASGI application serves static files itself (no CDN, no separate file server needed);
# set SERVE_STATIC=false when a reverse proxy serves STATIC_ROOT (after collectstatic).
SERVE_STATIC = env.bool("SERVE_STATIC", default=True)

# agents post event batches of up to 20,000 events (about 4 MB)
DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * 2**20

# the dashboard's login page (the browsable API keeps its own at /api-auth/login/)
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
# Password guessing: after this many failed logins for one username, or from one address,
# within the window, logins are refused (429, the form says so) until the window has passed
# since the oldest of them (webapp.accounts.throttle; counted in the cache below).
LOGIN_FAILURES_LIMIT = env.int("LOGIN_FAILURES_LIMIT", default=10)
LOGIN_FAILURES_WINDOW_S = env.int("LOGIN_FAILURES_WINDOW_S", default=15 * 60)
AUTHENTICATION_BACKENDS = [
    "webapp.accounts.backends.LoginThrottleBackend",  # refuses a throttled login, first
    "django.contrib.auth.backends.ModelBackend",
]

# --------------------------------------------------------------------------- Redis or embedded

REDIS_URL = env.str("REDIS_URL", default="")
# Prefix of every Redis key EdgePipe writes (broker, results, channel layer), so that several
# deployments, or test runs, can share one Redis.
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", default="edgepipe")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, and channels_redis
            # blocks 5 s in BZPOPMIN waiting for a consumer's next message: every consumer
            # idle for 5 s failed with "Timeout reading" and its WebSocket closed with 1011
            # (agents reconnected every 5 s and never measured their links)
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                       "prefix": f"{REDIS_KEY_PREFIX}:channels"},
        },
    }
else:
    # One process only: events sent from a Celery worker do not reach the web process's
    # consumers, which answer a {"type": "snapshot"} request with the current state instead.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# The same for commands to agents: the worker stores them, and the web process's connection of
# each device sends them on, looking this often (webapp.devices.commands).
COMMANDS_OUTBOX = not REDIS_URL
COMMANDS_OUTBOX_POLL_S = env.float("COMMANDS_OUTBOX_POLL_S", default=0.5)

# The cache (failed logins) is shared by the web processes: Redis, or files under var/ (not
# process memory: it outlives a restart, and the worker sees it).
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"{REDIS_KEY_PREFIX}:cache",
        },
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),  # created 0700, its files 0600
            "OPTIONS": {"MAX_ENTRIES": 10_000},
        },
    }

# --------------------------------------------------------------------------- Celery

CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="edgepipe")
# With acks_late a message taken by a worker that dies is handed out again once this long has
# passed since its delivery (Redis); make it longer than the slowest planning task, or a slow
# task is started a second time (harmless: planning a plan twice stores the same result).
CELERY_VISIBILITY_TIMEOUT_S = env.int("CELERY_VISIBILITY_TIMEOUT_S", default=900)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": CELERY_VISIBILITY_TIMEOUT_S,
        "unacked_restore_interval": max(1, min(60, CELERY_VISIBILITY_TIMEOUT_S // 5)),
        "unacked_restore_throttle": 1,
        "global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:",
    }
    CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": f"{REDIS_KEY_PREFIX}:"}
else:
    CELERY_QUEUE_DIR = VAR_DIR / "celery" / "queue"
    CELERY_BROKER_URL = "filesystem://localhost//"
    CELERY_BROKER_TRANSPORT = "webapp.broker:Transport"  # kombu's, with atomic writes
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_QUEUE_DIR),
        "data_folder_out": str(CELERY_QUEUE_DIR),
        "control_folder": str(VAR_DIR / "celery" / "control"),
        "store_processed": False,
        # kombu looks at the folder once a second by default, and the worker takes its next
        # task only at its next look: the planners of a run, queued together, each waited
        # most of a second for a few milliseconds of work (the demo's start waited on them,
        # docs/benchmarks.md); a listing of the folder is cheap
        "polling_interval": 0.1,
    }
    CELERY_RESULT_BACKEND = f"file://{VAR_DIR / 'celery' / 'results'}"
    private_dir(VAR_DIR)
    for _name in ("queue", "control", "results"):
        (VAR_DIR / "celery" / _name).mkdir(parents=True, exist_ok=True)

CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celery" / "beat-schedule")
DEVICE_OFFLINE_AFTER_S = env.int("DEVICE_OFFLINE_AFTER_S", default=60)
# The live idle breakdown is recomputed at most this often per run (it reads the window back).
LIVE_IDLE_INTERVAL_S = env.float("LIVE_IDLE_INTERVAL_S", default=2.0)
# Seconds a run may stay starting before the devices that did not answer fail it.
DEPLOY_TIMEOUT_S = env.int("DEPLOY_TIMEOUT_S", default=90)
# Seconds after a loss a recovery may wait for a survivor's halt before the run fails, naming
# it (an agent waits up to 30 s for each of its stages to stop).
HALT_TIMEOUT_S = env.int("HALT_TIMEOUT_S", default=180)
# A worker computing a plan marks it alive this often; one silent for PLAN_WORKER_SILENT_S has
# stopped: beat queues its plan again, and the run page says so.
PLAN_HEARTBEAT_S = env.float("PLAN_HEARTBEAT_S", default=5.0)
PLAN_WORKER_SILENT_S = env.float("PLAN_WORKER_SILENT_S", default=30.0)
# A supervisor of local agents (the demo) silent this long can no longer restart them.
SUPERVISOR_SILENT_S = env.float("SUPERVISOR_SILENT_S", default=10.0)
CELERY_BEAT_SCHEDULE = {
    "plans-watch": {
        "task": "webapp.runs.tasks.plans_watch",
        "schedule": max(2.0, PLAN_WORKER_SILENT_S / 3),
    },
    "devices-mark-offline": {
        "task": "webapp.devices.tasks.devices_mark_offline",
        "schedule": max(5, DEVICE_OFFLINE_AFTER_S // 4),
    },
    "runs-fail-stalled": {
        "task": "webapp.runs.tasks.runs_fail_stalled",
        "schedule": max(5, DEPLOY_TIMEOUT_S // 6),
    },
}

# --------------------------------------------------------------------------- EdgePipe

# Batches the simulator runs for each plan (planned timeline summary, simulated throughput).
PLANNING_SIMULATED_BATCHES = env.int("PLANNING_SIMULATED_BATCHES", default=4)
# Episodes a learned planner (TAPP) trains for; unset: the planner's own default.
PLANNING_LEARNED_EPISODES = env.int("PLANNING_LEARNED_EPISODES", default=None)
ENROLLMENT_TOKEN_TTL_S = env.int("ENROLLMENT_TOKEN_TTL_S", default=24 * 3600)
# Fault tolerance (docs/architecture.md): where the stages' weights uploaded to the server
# (global replicas, safetensors) are kept, the largest upload taken, and how long a probed
# agent has to answer before it is counted dead.
REPLICA_DIR = Path(env.str("REPLICA_DIR", default=str(VAR_DIR / "replicas"))).resolve()
REPLICA_MAX_BYTES = env.int("REPLICA_MAX_BYTES", default=256 * 2**20)
PROBE_TIMEOUT_S = env.float("PROBE_TIMEOUT_S", default=1.0)

# --------------------------------------------------------------------------- REST API

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["webapp.common.auth.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer",
                                 "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "webapp.common.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "EdgePipe API",
    "DESCRIPTION": ("Devices, enrolment, profiles, runs and plans. Browser users log in with a "
                    "Django session; agents send `Authorization: Device <uid>:<key>`."),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
