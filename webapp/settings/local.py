"""A laptop or a lab bench: debug on, an insecure secret key unless one is given."""

from pathlib import Path

from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import DATABASES, env, private_file

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-edgepipe-local-only")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"])

# The embedded database (var/db.sqlite3) holds the sessions and the devices' key hashes: it is
# made here, before migrate or the server opens it, readable by this user only (SQLite would
# make it 0644; its -wal and -shm files take its mode). An empty file is an empty database.
if (DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
        and DATABASES["default"]["NAME"] != ":memory:"):
    _db = Path(DATABASES["default"]["NAME"])
    private_file(_db)
    for _journal in (_db.with_name(_db.name + "-wal"), _db.with_name(_db.name + "-shm")):
        if _journal.exists():
            private_file(_journal)
