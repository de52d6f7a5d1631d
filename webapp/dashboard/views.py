"""The dashboard's pages (logged-in users): overview, devices, a device, runs, a new run, a run,
and the run's downloads. Thin: selectors read, services write, templates and the page scripts
under static/dashboard/ do the rest."""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from orchestrator.errors import PlanningError
from webapp.common.permissions import staff_required
from webapp.dashboard import pipelearn_form, reports, selectors, services
from webapp.dashboard.services import FormErrors, FormInvalid
from webapp.devices import services as device_services
from webapp.devices.events import devices_snapshot
from webapp.devices.selectors import device_list, model_spec_list
from webapp.runs.events import WINDOW_S
from webapp.runs.selectors import plan_compare, run_devices, run_list, run_planning_inputs
from webapp.runs.states import RunState


def _embedded() -> bool:
    """Whether events sent by worker processes miss the pages (the in-memory channel layer)."""
    return settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer")


def _server_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/").rstrip("/")


def _devices_config() -> dict[str, Any]:
    """What the devices pages' script needs: whether to poll, where a device's page is."""
    return {"embedded": _embedded(),
            "detail_url": reverse("dashboard:device", args=[0]).replace("/0/", "/{id}/")}


# --------------------------------------------------------------------------- overview


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    active = list(selectors.run_page(state_filter="active")[:10])
    recent = list(selectors.run_page(state_filter=None)[:8])
    return render(request, "dashboard/overview.html", {
        "counts": selectors.overview_counts(), "active": active, "recent": recent,
        "progress": selectors.run_progress([*active, *recent])})


# --------------------------------------------------------------------------- devices


@login_required
@require_http_methods(["GET", "POST"])
@staff_required(action="create enrolment tokens", methods=["POST"])
def devices(request: HttpRequest) -> HttpResponse:
    """The devices, live; POST (staff only) creates an enrolment token and shows the agent's
    commands."""
    enrolment, errors = None, {}
    if request.method == "POST":
        try:
            enrolment = services.enrolment_create(form=request.POST, created_by=request.user,
                                                  server_url=_server_url(request))
        except FormInvalid as exc:
            errors = exc.errors
    return render(request, "dashboard/devices.html", {
        "enrolment": enrolment, "errors": errors, "form": request.POST,
        "open_enrolment": request.method == "POST" or "add" in request.GET,
        "initial": devices_snapshot(device_list()), "links": selectors.links_all(),
        "config": {**_devices_config(), "links_url": reverse("device-links")},
        "server_url": _server_url(request)})


@login_required
@require_http_methods(["GET", "POST"])
def device(request: HttpRequest, device_id: int) -> HttpResponse:
    """A device: its facts, live status, per-layer profile chart and runs; POST renames it."""
    found = get_object_or_404(device_list(), pk=device_id)
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        try:
            services.device_rename_from_form(device=found, form=request.POST)
        except FormInvalid as exc:
            errors = exc.errors
        else:
            messages.success(request, f"Renamed to {found.name}.")
            return redirect("dashboard:device", device_id=found.pk)
    return render(request, "dashboard/device.html", {
        "device": found, "errors": errors, "form": request.POST,
        "profiles": selectors.device_profiles(device=found),
        "runs": selectors.device_runs(device=found),
        "links": selectors.device_links(device=found), "specs": model_spec_list(),
        "initial": devices_snapshot([found]),
        "config": {**_devices_config(), "device": found.pk,
                   "profile_url": reverse("device-profile", args=[found.pk]),
                   "specs_url": reverse("model-spec-list"),
                   "profiles_url": f"{reverse('profile-list')}?device={found.pk}"},
    })


@login_required
@require_POST
@staff_required(action="retire devices")
def device_retire(request: HttpRequest, device_id: int) -> HttpResponse:
    found = get_object_or_404(device_list(), pk=device_id)
    device_services.device_retire(device=found)
    messages.success(request, f"{found.name} is retired: its key no longer works and new runs "
                              "cannot use it.")
    return redirect("dashboard:device", device_id=found.pk)


# --------------------------------------------------------------------------- runs


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    state_filter = request.GET.get("state") or None
    if state_filter not in (None, *selectors.RUN_FILTERS):
        state_filter = None
    page = Paginator(selectors.run_page(state_filter=state_filter),
                     selectors.RUNS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/runs.html", {
        "page": page, "state_filter": state_filter, "counts": selectors.run_filter_counts(),
        "filters": list(selectors.RUN_FILTERS), "progress": selectors.run_progress(page)})


@login_required
@require_http_methods(["GET", "POST"])
def run_new(request: HttpRequest) -> HttpResponse:
    """The new-run form: on success the run is created, its planning queued, and the browser
    goes to its page; otherwise each error is shown next to its field."""
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        try:
            run = services.run_create_and_plan(form=request.POST, created_by=request.user)
        except FormInvalid as exc:
            errors = exc.errors
        else:
            return redirect("dashboard:run", run_id=run.pk)
    choices = selectors.new_run_choices()
    form = request.POST if request.method == "POST" else None
    chosen = [int(v) for v in form.getlist("devices") if v.isdigit()] if form else []
    rank = {pk: k for k, pk in enumerate(chosen)}
    choices["devices"].sort(key=lambda c: (rank.get(c["device"].pk, len(rank)),))
    return render(request, "dashboard/run_new.html", {
        "choices": choices, "errors": errors, "form": form, "chosen_devices": chosen,
        "chosen_algorithms": form.getlist("algorithms") if form else choices["default_planners"],
        # a checkbox cannot show a value: ticked as sent, else as the run's default
        "vertical_sync": (services.run_form_data(form) if form else {}).get(
            "vertical_sync", choices["defaults"]["vertical_sync"]),
    })


@login_required
@require_http_methods(["GET", "POST"])
def run_new_pipelearn(request: HttpRequest) -> HttpResponse:
    """The form that trains PipeLearn on devices (a server and devices that keep their data):
    on success the run is created, its planning queued, and the browser goes to its page;
    otherwise each error is shown by its field, a device's P and N by its row."""
    errors: FormErrors = {}
    if request.method == "POST":
        try:
            run = pipelearn_form.pipelearn_run_create_and_plan(form=request.POST,
                                                               created_by=request.user)
        except FormInvalid as exc:
            errors = exc.errors
        else:
            return redirect("dashboard:run", run_id=run.pk)
    form = request.POST if request.method == "POST" else None
    return render(request, "dashboard/run_new_pipelearn.html",
                  pipelearn_form.pipelearn_form_context(form=form, errors=errors))


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    found = get_object_or_404(run_list().select_related("model_spec"), pk=run_id)
    rows = [{"device": d.uid, "label": d.name, "id": d.pk, "status": d.status}
            for d in run_devices(run=found)]
    # the devices in the run's order; the page lays its Gantts out by the plans' stages
    config = {
        "run": found.pk, "ws_path": f"/ws/runs/{found.pk}/", "window_s": WINDOW_S,
        "embedded": _embedded(), "devices": rows,
        "layouts": selectors.run_plan_layouts(run=found),
        "urls": {
            "layouts": reverse("dashboard-api:plan-layouts", args=[found.pk]),
            "plan": reverse("run-plan", args=[found.pk]),
            "start": reverse("run-start", args=[found.pk]),
            "pause": reverse("run-pause", args=[found.pk]),
            "stop": reverse("run-stop", args=[found.pk]),
            "compare": reverse("plan-compare", args=[found.pk]),
            "plan_timeline": reverse("dashboard-api:plan-timeline", args=[found.pk, 0])
            .replace("/0/timeline/", "/{plan}/timeline/"),
            "ghost": reverse("dashboard-api:run-planned", args=[found.pk]),
            "timeline": reverse("run-timeline", args=[found.pk]),
            "stop_agent": reverse("device-stop-agent", args=[0]).replace("/0/", "/{id}/"),
            "restart_agent": reverse("device-restart-agent", args=[0]).replace("/0/", "/{id}/"),
            "split": (reverse("split-progress", args=[found.pk]) if found.kind == "split"
                      else None),
        },
    }
    return render(request, "dashboard/run.html", {
        "run": found, "devices": rows, "config": config,
        "compare": plan_compare(run=found), "active": found.state != RunState.DRAFT})


# --------------------------------------------------------------------------- downloads


def _attachment(response: HttpResponse | StreamingHttpResponse, filename: str
                ) -> HttpResponse | StreamingHttpResponse:
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


STREAM_CHUNK = 1000


def _streamed(request: HttpRequest, lines: Iterator[str]) -> Iterator[str] | AsyncIterator[str]:
    """The lines of a download as the server wants them. Under ASGI (daphne) Django reads a
    synchronous iterator whole into memory before sending it; an hours-long run's trace is
    too big for that, so there the lines are read a chunk at a time in the database's thread
    and sent as they come."""
    if not isinstance(request, ASGIRequest):
        return lines
    pull = sync_to_async(lambda: "".join(itertools.islice(lines, STREAM_CHUNK)),
                         thread_sensitive=True)

    async def chunks() -> AsyncIterator[str]:
        while chunk := await pull():
            yield chunk

    return chunks()


def _trace_stream(trace: selectors.ChromeTrace) -> Iterator[str]:
    run = trace.run
    yield '{"displayTimeUnit": "ms", "otherData": ' + json.dumps(
        {"run": run.pk, "name": run.name, "schedule": run.schedule,
         "microbatches": run.microbatches, "batch_size": run.model_spec.batch_size}) + \
        ', "traceEvents": [\n'
    first = True
    for event in (*trace.events(), *trace.metadata()):
        yield ("" if first else ",\n") + json.dumps(event, separators=(",", ":"))
        first = False
    yield "\n]}\n"


@login_required
def run_export_trace(request: HttpRequest, run_id: int) -> StreamingHttpResponse:
    """The run's whole timeline as a Chrome trace (Perfetto opens it), streamed."""
    found = get_object_or_404(run_list(), pk=run_id)
    trace = selectors.ChromeTrace(found)
    return _attachment(StreamingHttpResponse(_streamed(request, _trace_stream(trace)),
                                             content_type="application/json"),
                       f"edgepipe-run-{found.pk}-trace.json")


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
def run_export_metrics(request: HttpRequest, run_id: int) -> StreamingHttpResponse:
    """Every metric point of the run as CSV (at_s, kind, device, value), streamed."""
    found = get_object_or_404(run_list(), pk=run_id)
    writer = csv.writer(_Echo())
    rows: Iterator[Any] = (writer.writerow(r) for r in (
        ("at_s", "kind", "device", "value"), *selectors.run_metric_rows(run=found)))
    return _attachment(StreamingHttpResponse(_streamed(request, rows),
                                             content_type="text/csv; charset=utf-8"),
                       f"edgepipe-run-{found.pk}-metrics.csv")


@login_required
def run_export_plan(request: HttpRequest, run_id: int) -> JsonResponse:
    """The plan the run trains now (its chosen plan, or a re-partition's; else its best;
    ``?plan=<id>`` for another) as plan JSON."""
    found = get_object_or_404(run_list(), pk=run_id)
    raw = request.GET.get("plan", "")
    exported = selectors.run_export_plan(run=found, plan_id=int(raw) if raw.isdigit() else None)
    if exported is None:
        raise Http404(f"run {found.pk} has no computed plan yet" if not raw
                      else f"run {found.pk} has no computed plan {raw}")
    document, name = exported
    return _attachment(JsonResponse(document, json_dumps_params={"indent": 2}),
                       f"edgepipe-run-{found.pk}-plan-{name}.json")


@login_required
def run_export_report(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run's report: plans, Gantt, idle time, throughput, loss and accuracy, faults, as one
    HTML file that opens offline (plotly.js inside; ``python -m orchestrator report`` makes
    the same from the other downloads)."""
    found = get_object_or_404(run_list().select_related("model_spec", "chosen_plan"),
                              pk=run_id)
    return _attachment(HttpResponse(reports.run_report(run=found),
                                    content_type="text/html; charset=utf-8"),
                       f"edgepipe-run-{found.pk}-report.html")


def _planning_input(request: HttpRequest, run_id: int, part: str) -> JsonResponse:
    found = get_object_or_404(run_list(), pk=run_id)
    try:
        profile, devices = run_planning_inputs(run=found)
    except PlanningError as exc:
        raise Http404(f"run {found.pk} cannot be planned yet: {exc}") from None
    document = profile.to_json() if part == "model" else devices.to_json()
    return _attachment(JsonResponse(document, json_dumps_params={"indent": 2}),
                       f"edgepipe-run-{found.pk}.{part}.json")


@login_required
def run_export_profile(request: HttpRequest, run_id: int) -> JsonResponse:
    """The model profile the run is planned with (``python -m orchestrator ... --profile``)."""
    return _planning_input(request, run_id, "model")


@login_required
def run_export_devices(request: HttpRequest, run_id: int) -> JsonResponse:
    """The device set the run is planned with, measured links included (``--devices``)."""
    return _planning_input(request, run_id, "devices")


@login_required
def runs_compare(request: HttpRequest) -> HttpResponse:
    """Runs side by side (``?runs=3&runs=7``): plan, measured against predicted throughput,
    idle time, loss and accuracy, the throughput over time of each, and (split learning,
    PipeLearn and its baselines) the averaged model's held-out accuracy after each round."""
    try:
        ids = selectors.runs_compare_ids(request.GET.getlist("runs"))
    except ValueError as exc:
        return render(request, "dashboard/runs_compare.html", {"error": str(exc)}, status=400)
    found = {r.pk: r for r in run_list().filter(pk__in=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise Http404(f"no run {missing[0]}")
    rows = selectors.runs_compared([found[i] for i in ids])
    series = [{"name": f"#{r['run'].pk} {r['run'].name}",
               "x": [at for at, _ in r["throughput"]], "y": [v for _, v in r["throughput"]],
               "held_out": r["held_out"]}
              for r in rows]
    return render(request, "dashboard/runs_compare.html", {"rows": rows, "series": series})
