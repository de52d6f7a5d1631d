"""Create an enrolment token from the shell and print it with the agent's enrol command."""

from __future__ import annotations

import argparse
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.devices.services import enrollment_token_create


class Command(BaseCommand):
    help = "Create an enrolment token for devices and print it (shown once)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--label", default="", help="what the token is for")
        parser.add_argument("--uses", type=int, default=1,
                            help="how many devices may enrol with it (default 1)")
        parser.add_argument("--expires-in", type=int, metavar="SECONDS",
                            help="lifetime in seconds (default ENROLLMENT_TOKEN_TTL_S)")
        parser.add_argument("--user", help="username recorded as its creator")
        parser.add_argument("--server", default="http://127.0.0.1:8000",
                            help="the server URL printed in the agent command")
        parser.add_argument("--quiet", action="store_true", help="print only the token")

    def handle(self, *args: Any, **options: Any) -> None:
        for option in ("uses", "expires_in"):
            if options[option] is not None and options[option] < 1:
                flag = option.replace("_", "-")
                raise CommandError(f"--{flag} must be at least 1, got {options[option]}")
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"--user: no user named {options['user']!r}")
        token, secret = enrollment_token_create(created_by=user, label=options["label"],
                                                max_uses=options["uses"],
                                                expires_in_s=options["expires_in"])
        if options["quiet"]:
            self.stdout.write(secret)
            return
        self.stdout.write(f"enrolment token {token.pk} (expires {token.expires_at:%Y-%m-%d %H:%M} "
                          f"UTC, {token.max_uses} use(s)):\n{secret}\n\non the device:\n"
                          f"  python -m agent enrol --server {options['server']} "
                          f"--token {secret}\n  python -m agent run")
