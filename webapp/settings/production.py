"""Several web and worker processes on PostgreSQL and Redis (docker-compose.yml): everything
secret or site-specific must come from the environment."""

from django.core.exceptions import ImproperlyConfigured

from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import DATABASES, REDIS_URL, SECRET_KEY, env

DEBUG = env.bool("DEBUG", default=False)
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set in production")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    raise ImproperlyConfigured("DATABASE_URL must name a PostgreSQL database in production "
                               "(postgres://user:password@host:5432/name)")
if not REDIS_URL:
    raise ImproperlyConfigured("REDIS_URL must be set in production (redis://host:6379/0)")

SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
