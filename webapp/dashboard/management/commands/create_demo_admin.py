"""Create (or reset) a superuser for a demo and print its password."""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a demo superuser (or give an existing one a new password) and print it."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--email", default="admin@localhost")

    def handle(self, *args: Any, **options: Any) -> None:
        password = secrets.token_urlsafe(12)
        user, created = get_user_model().objects.get_or_create(
            username=options["username"], defaults={"email": options["email"]})
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        verb = "created" if created else "updated"
        self.stdout.write(f"demo admin {verb}: username {user.username} password {password}")
