from django.urls import path

from webapp.runs import apis, pipelearn_apis, split_apis

urlpatterns = [
    path("runs/", apis.RunListCreateApi.as_view(), name="run-list"),
    path("runs/split/", split_apis.SplitRunCreateApi.as_view(), name="split-run-create"),
    path("runs/pipelearn/", pipelearn_apis.PipelearnRunCreateApi.as_view(),
         name="pipelearn-run-create"),
    path("runs/<int:run_id>/", apis.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<int:run_id>/plan/", apis.RunPlanApi.as_view(), name="run-plan"),
    path("runs/<int:run_id>/start/", apis.RunStartApi.as_view(), name="run-start"),
    path("runs/<int:run_id>/pause/", apis.RunPauseApi.as_view(), name="run-pause"),
    path("runs/<int:run_id>/stop/", apis.RunStopApi.as_view(), name="run-stop"),
    path("runs/<int:run_id>/split/", split_apis.SplitProgressApi.as_view(),
         name="split-progress"),
    path("runs/<int:run_id>/timeline/", apis.RunTimelineApi.as_view(), name="run-timeline"),
    path("runs/<int:run_id>/plans/", apis.PlanListApi.as_view(), name="plan-list"),
    path("runs/<int:run_id>/plans/compare/", apis.PlanCompareApi.as_view(),
         name="plan-compare"),
    path("agent/runs/", apis.AgentRunListApi.as_view(), name="agent-run-list"),
    path("agent/runs/<int:run_id>/", apis.AgentRunDetailApi.as_view(), name="agent-run-detail"),
    path("agent/runs/<int:run_id>/events/", apis.AgentRunEventsApi.as_view(),
         name="agent-run-events"),
    path("agent/runs/<int:run_id>/replicas/", apis.AgentRunReplicasApi.as_view(),
         name="agent-run-replicas"),
]
