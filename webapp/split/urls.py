"""Split learning's pages (``urlpatterns``, under /split/) and REST API (``api_urlpatterns``,
under /api/split/)."""

from django.urls import path

from webapp.split import apis, views

app_name = "split"

urlpatterns = [
    path("", views.studies, name="split-studies"),
    path("<int:study_id>/", views.study, name="split-study"),
    path("train/", views.train, name="split-train"),
]

api_urlpatterns = [
    path("instances/", apis.SharedInstanceListApi.as_view(), name="split-instance-list"),
    path("studies/", apis.SplitStudyListCreateApi.as_view(), name="split-study-list"),
    path("studies/<int:study_id>/", apis.SplitStudyDetailApi.as_view(),
         name="split-study-detail"),
    path("studies/<int:study_id>/compare/", apis.SplitStudyCompareApi.as_view(),
         name="split-study-compare"),
    path("studies/<int:study_id>/schedules/<int:schedule_id>/gantt/",
         apis.SplitScheduleGanttApi.as_view(), name="split-schedule-gantt"),
]
