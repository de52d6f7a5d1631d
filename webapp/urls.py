"""URLs: the REST API under /api/ (users) and /api/agent/ (devices), its OpenAPI schema and
documentation page (Swagger UI from drf-spectacular-sidecar: no CDN), the admin, and session
login."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("", RedirectView.as_view(url="/api/docs/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include("webapp.devices.urls")),
    path("api/", include("webapp.runs.urls")),
]

handler400 = "webapp.common.views.bad_request"
handler404 = "webapp.common.views.not_found"
handler500 = "webapp.common.views.server_error"
