"""The dashboard's pages (``urlpatterns``, at the site's root) and the data its pages fetch
(``api_urlpatterns``, under /api/dashboard/)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.accounts.views import LoginView
from webapp.dashboard import apis, views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("devices/", views.devices, name="devices"),
    path("devices/<int:device_id>/", views.device, name="device"),
    path("devices/<int:device_id>/retire/", views.device_retire, name="device-retire"),
    path("runs/", views.runs, name="runs"),
    path("runs/new/", views.run_new, name="run-new"),
    path("runs/new/pipelearn/", views.run_new_pipelearn, name="run-new-pipelearn"),
    path("runs/compare/", views.runs_compare, name="runs-compare"),
    path("runs/<int:run_id>/", views.run, name="run"),
    path("runs/<int:run_id>/export/trace.json", views.run_export_trace, name="export-trace"),
    path("runs/<int:run_id>/export/metrics.csv", views.run_export_metrics,
         name="export-metrics"),
    path("runs/<int:run_id>/export/plan.json", views.run_export_plan, name="export-plan"),
    path("runs/<int:run_id>/export/model.json", views.run_export_profile,
         name="export-profile"),
    path("runs/<int:run_id>/export/devices.json", views.run_export_devices,
         name="export-devices"),
    path("runs/<int:run_id>/export/report.html", views.run_export_report, name="export-report"),
]

api_urlpatterns = ([
    path("runs/<int:run_id>/plans/layouts/", apis.PlanLayoutsApi.as_view(),
         name="plan-layouts"),
    path("runs/<int:run_id>/plans/<int:plan_id>/timeline/", apis.PlanTimelineApi.as_view(),
         name="plan-timeline"),
    path("runs/<int:run_id>/planned/", apis.RunPlannedApi.as_view(), name="run-planned"),
], "dashboard-api")
