"""pytest: an in-memory SQLite test database, a fast password hasher, Celery tasks run in the
test process (the integration tests start real workers and servers with other settings)."""

from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import env

DEBUG = False
SECRET_KEY = "test-only-secret-key-not-for-production"
ALLOWED_HOSTS = ["*"]
DATABASES = {"default": env.db_url_config("sqlite://:memory:")}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
COMMANDS_OUTBOX = False  # one process: tasks run eagerly in it (test_outbox.py turns it on)
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = "cache+memory://"
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
PLANNING_SIMULATED_BATCHES = 2
LOGGING = {"version": 1, "disable_existing_loggers": False}

# every agent batch recomputes the idle breakdown, so that tests see each one
LIVE_IDLE_INTERVAL_S = 0.0
