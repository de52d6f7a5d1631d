"""ASGI entry point (daphne): HTTP through Django (and its static files), WebSockets through
Channels' consumers with the browser's Django session; a WebSocket to any other path is refused
before its handshake completes (daphne answers 403)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the apps loaded)
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import SuspiciousFileOperation  # noqa: E402
from django.http import Http404, HttpRequest, HttpResponseBase  # noqa: E402
from django.urls import URLPattern, re_path  # noqa: E402

from webapp.dashboard.routing import websocket_urlpatterns  # noqa: E402
from webapp.gateway.routing import websocket_urlpatterns as agent_urlpatterns  # noqa: E402


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's handler, but a path that leads out of the static directories
    (``/static/..%2f..%2fmanage.py``) is a 404 like any file it does not have: Django's raised
    SuspiciousFileOperation, which this handler let through as a 500 with a traceback."""

    def serve(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return super().serve(request)
        except SuspiciousFileOperation:
            raise Http404("no such static file") from None


# Static files (the API documentation's Swagger UI, later the dashboard's scripts) come from
# this server: devices and dashboards are often offline, so nothing is loaded from a CDN.
http_app = StaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app


class NoSuchSocket(AsyncWebsocketConsumer):
    """A WebSocket to a path no consumer serves: closed before it is accepted (Channels'
    router raised "No route found", a 500 and a traceback)."""

    async def connect(self) -> None:
        await self.close()


def browser_routes(routes: list[URLPattern]) -> list[URLPattern]:
    """Browsers' sockets carry the page's session and must come from an allowed host. Agents'
    sockets authenticate with their device key and send no Origin (they are not browsers and
    carry no cookie), so only the browsers' routes are wrapped."""
    return [URLPattern(r.pattern, AllowedHostsOriginValidator(AuthMiddlewareStack(r.callback)),
                       r.default_args, r.name) for r in routes]


application = ProtocolTypeRouter({
    "http": http_app,
    "websocket": URLRouter([*agent_urlpatterns, *browser_routes(websocket_urlpatterns),
                            re_path(r"", NoSuchSocket.as_asgi())]),
})
