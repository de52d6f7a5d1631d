"""One command for a laptop: migrate, then run the ASGI server (daphne) and a Celery worker
(with beat) as child processes until Ctrl-C; if either stops, the other is stopped too."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

STOP_GRACE_S = 20


class Command(BaseCommand):
    help = "Migrate, then run the web server and a planning worker (Ctrl-C stops both)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default "
                                                                 "127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
        parser.add_argument("--concurrency", type=int, default=2,
                            help="worker processes for planning (default 2)")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        python = sys.executable
        commands = {
            "worker": [python, "-m", "celery", "-A", "webapp", "worker", "--beat",
                       "--loglevel", "INFO", "--concurrency", str(options["concurrency"]),
                       "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME],
            "web": [python, "-m", "daphne", "-b", options["host"], "-p", str(options["port"]),
                    "webapp.asgi:application"],
        }
        # own process groups: Ctrl-C reaches this command only, which stops both in order
        children = {name: subprocess.Popen(cmd, process_group=0)
                    for name, cmd in commands.items()}
        broker = "Redis" if settings.REDIS_URL else "the filesystem broker under var/"
        self.stdout.write(f"EdgePipe on http://{options['host']}:{options['port']}/ "
                          f"(worker on {broker}); Ctrl-C stops")
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exited = None
        while not stopping and exited is None:
            time.sleep(0.2)
            exited = next((n for n, p in children.items() if p.poll() is not None), None)
        for proc in children.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if exited is not None:
            code = children[exited].returncode
            self.stderr.write(f"the {exited} process stopped (exit code {code}); stopped the rest")
            sys.exit(code or 1)
