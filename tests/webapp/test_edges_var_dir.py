"""The embedded setup's state is private: var/ is created 0700 and the SQLite database that
``manage.py migrate`` creates there 0600 (it was 0755 and 0644: world-readable sessions and
device key hashes); its cache (failed logins) is files there, not process memory."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # manage.py migrate in a subprocess, twice


def run_manage(*args: str, var: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**clean, "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
             "EDGEPIPE_VAR_DIR": str(var)},
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        umask=0o022)  # the usual umask: what was created world-readable


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_migrate_creates_a_private_var_dir_and_database(tmp_path: Path) -> None:
    var = tmp_path / "state" / "var"
    done = run_manage("migrate", "--noinput", var=var)
    assert done.returncode == 0, done.stderr
    db = var / "db.sqlite3"
    assert db.stat().st_size > 0  # migrated
    assert oct(mode(var)) == oct(0o700)
    assert oct(mode(db)) == oct(0o600)
    for journal in (var / "db.sqlite3-wal", var / "db.sqlite3-shm"):
        if journal.exists():
            assert oct(mode(journal)) == oct(0o600)
    # the cache is files under var/, private too
    done = run_manage("shell", "--no-imports", "-c",
                      "from django.core.cache import caches; caches['default'].set('k', 1, 60); "
                      "print(type(caches['default']).__name__)", var=var)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "FileBasedCache"
    assert oct(mode(var / "cache")) == oct(0o700)
    assert all(mode(f) == 0o600 for f in (var / "cache").iterdir())


def test_an_existing_world_readable_database_is_made_private(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    (var / "db.sqlite3").touch()
    (var / "db.sqlite3").chmod(0o644)
    done = run_manage("migrate", "--noinput", var=var)
    assert done.returncode == 0, done.stderr
    assert oct(mode(var / "db.sqlite3")) == oct(0o600)
    assert oct(mode(var)) == oct(0o755 & ~0o022)  # a directory that exists is left as it is
