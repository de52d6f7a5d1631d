"""A laptop or a lab bench: debug on, an insecure secret key unless one is given."""

from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import env

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-edgepipe-local-only")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"])
