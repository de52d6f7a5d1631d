"""URLs: the dashboard's pages at the root (login, devices, runs), split learning's pages under
/split/, the REST API under /api/ (users; split learning under /api/split/) and /api/agent/
(devices), the data the pages fetch under /api/dashboard/, the OpenAPI schema and documentation
page (Swagger UI from drf-spectacular-sidecar: no CDN), the admin, and the browsable API's
session login. Every login form counts failed logins and refuses more when there were too many
(webapp.accounts)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from webapp.accounts.forms import AdminLoginForm
from webapp.accounts.views import LoginView
from webapp.dashboard.urls import api_urlpatterns as dashboard_api_urlpatterns
from webapp.split.urls import api_urlpatterns as split_api_urlpatterns

admin.site.login_form = AdminLoginForm

# rest_framework.urls, with the throttled login
api_auth_urlpatterns = ([
    path("login/", LoginView.as_view(template_name="rest_framework/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
], "rest_framework")

urlpatterns = [
    path("", include("webapp.dashboard.urls")),
    path("split/", include("webapp.split.urls")),
    path("admin/", admin.site.urls),
    path("api-auth/", include(api_auth_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/dashboard/", include(dashboard_api_urlpatterns)),
    path("api/", include("webapp.devices.urls")),
    path("api/", include("webapp.runs.urls")),
    path("api/split/", include(split_api_urlpatterns)),
]

handler400 = "webapp.common.views.bad_request"
handler404 = "webapp.common.views.not_found"
handler500 = "webapp.common.views.server_error"
