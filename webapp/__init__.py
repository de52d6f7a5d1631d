"""EdgePipe's Django project: settings, URLs, ASGI and Celery, and the devices, runs and
dashboard apps. The Celery app is loaded with Django so that ``shared_task`` binds to it."""

from webapp.celery import app as celery_app

__all__ = ("celery_app",)
