"""The settings choose the embedded or the shared topology from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PRINT = """
import json
from django.conf import settings
print(json.dumps({
    "db": settings.DATABASES["default"]["ENGINE"], "db_name": settings.DATABASES["default"]["NAME"],
    "db_options": settings.DATABASES["default"].get("OPTIONS", {}),
    "broker": settings.CELERY_BROKER_URL, "results": settings.CELERY_RESULT_BACKEND,
    "transport": settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    "broker_transport": getattr(settings, "CELERY_BROKER_TRANSPORT", None),
    "layer": settings.CHANNEL_LAYERS["default"],
    "acks_late": settings.CELERY_TASK_ACKS_LATE,
    "reject_on_worker_lost": settings.CELERY_TASK_REJECT_ON_WORKER_LOST,
    "debug": settings.DEBUG,
}))
"""


def load(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup()\n{PRINT}"],
        env={**clean, "DJANGO_SETTINGS_MODULE": module, **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False)


def test_embedded_needs_no_server_and_keeps_its_state_under_var(tmp_path: Path):
    done = load("webapp.settings.local", {"EDGEPIPE_VAR_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["db"] == "django.db.backends.sqlite3"
    assert got["db_name"] == str(tmp_path / "db.sqlite3")
    assert got["db_options"]["transaction_mode"] == "IMMEDIATE"
    assert got["broker"].startswith("filesystem://")
    assert got["broker_transport"] == "webapp.broker:Transport"
    assert got["transport"]["data_folder_in"] == str(tmp_path / "celery" / "queue")
    assert got["results"] == f"file://{tmp_path / 'celery' / 'results'}"
    assert got["layer"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"
    assert (tmp_path / "celery" / "queue").is_dir() and (tmp_path / "celery" / "control").is_dir()
    assert got["acks_late"] and got["reject_on_worker_lost"] and got["debug"]


def test_shared_uses_postgresql_and_redis_for_everything():
    done = load("webapp.settings.production", {
        "SECRET_KEY": "s" * 50, "DATABASE_URL": "postgres://edge:pw@db:5432/edgepipe",
        "REDIS_URL": "redis://cache:6379/0", "REDIS_KEY_PREFIX": "lab1",
        "CELERY_VISIBILITY_TIMEOUT_S": "600"})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["db"] == "django.db.backends.postgresql" and got["db_name"] == "edgepipe"
    assert got["broker"] == got["results"] == "redis://cache:6379/0"
    assert got["transport"]["visibility_timeout"] == 600
    assert got["transport"]["global_keyprefix"] == "lab1:celery:"
    assert got["layer"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert got["layer"]["CONFIG"] == {"hosts": [{"address": "redis://cache:6379/0",
                                                  "socket_timeout": 30}],
                                      "prefix": "lab1:channels"}
    assert got["debug"] is False


@pytest.mark.parametrize(("env", "message"), [
    ({"DATABASE_URL": "postgres://db/x", "REDIS_URL": "redis://r"}, "SECRET_KEY must be set"),
    ({"SECRET_KEY": "k", "REDIS_URL": "redis://r"}, "DATABASE_URL must name a PostgreSQL"),
    ({"SECRET_KEY": "k", "DATABASE_URL": "postgres://db/x"}, "REDIS_URL must be set"),
])
def test_production_refuses_to_start_without_its_servers(env, message):
    done = load("webapp.settings.production", env)
    assert done.returncode != 0 and message in done.stderr
