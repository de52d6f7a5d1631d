"""The Celery app: configuration from Django settings (``CELERY_*``), tasks from each app's
``tasks.py``. Start a worker with ``celery -A webapp worker``."""

import os

from celery import Celery
from celery.signals import worker_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _commands_through_outbox(**kwargs: object) -> None:
    """On the embedded setup this worker's channel layer is its own: its commands to agents
    go through the database (webapp.devices.commands), its pool's processes forked after."""
    from django.conf import settings

    if settings.COMMANDS_OUTBOX:
        from webapp.devices.commands import commands_through_outbox

        commands_through_outbox()


@worker_ready.connect
def _resume_planning(**kwargs: object) -> None:
    """The filesystem broker (embedded topology) forgets the messages a killed worker had
    taken: queue unfinished plans again when a worker starts. Redis redelivers them itself."""
    if app.conf.broker_url.startswith("filesystem"):
        from webapp.runs.services import plans_requeue_unfinished

        plans_requeue_unfinished()
