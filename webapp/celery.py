"""The Celery app: configuration from Django settings (``CELERY_*``), tasks from each app's
``tasks.py``. Start a worker with ``celery -A webapp worker``."""

import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _resume_planning(**kwargs: object) -> None:
    """The filesystem broker (embedded topology) forgets the messages a killed worker had
    taken: queue unfinished plans again when a worker starts. Redis redelivers them itself."""
    if app.conf.broker_url.startswith("filesystem"):
        from webapp.runs.services import plans_requeue_unfinished

        plans_requeue_unfinished()
