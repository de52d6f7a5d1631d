"""ASGI entry point (daphne): HTTP through Django (and its static files), WebSockets through
Channels' consumers with the browser's Django session."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the apps loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import URLPattern  # noqa: E402

from webapp.dashboard.routing import websocket_urlpatterns  # noqa: E402
from webapp.gateway.routing import websocket_urlpatterns as agent_urlpatterns  # noqa: E402

# Static files (the API documentation's Swagger UI, later the dashboard's scripts) come from
# this server: devices and dashboards are often offline, so nothing is loaded from a CDN.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app



def browser_routes(routes: list[URLPattern]) -> list[URLPattern]:
    """Browsers' sockets carry the page's session and must come from an allowed host. Agents'
    sockets authenticate with their device key and send no Origin (they are not browsers and
    carry no cookie), so only the browsers' routes are wrapped."""
    return [URLPattern(r.pattern, AllowedHostsOriginValidator(AuthMiddlewareStack(r.callback)),
                       r.default_args, r.name) for r in routes]


application = ProtocolTypeRouter({
    "http": http_app,
    "websocket": URLRouter([*agent_urlpatterns, *browser_routes(websocket_urlpatterns)]),
})
