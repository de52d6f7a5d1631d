"""What the benchmarks that drive a real local testbed share: Django on the embedded default with
a var dir of their own, and a free port for its web server."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(var_dir: str) -> None:
    """Django with ``var_dir`` as its var dir, on the embedded default (REDIS_URL and
    DATABASE_URL unset, whatever this shell has), from the checkout's root, with DEBUG off as
    a deployed server runs (in debug mode Django's cursor wrapper records every query, which
    cost the web process while agents report their events)."""
    for name in ("REDIS_URL", "DATABASE_URL"):
        os.environ.pop(name, None)
    os.environ["DEBUG"] = "false"
    os.environ["EDGEPIPE_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings.local"
    os.chdir(ROOT)
    import django

    django.setup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
