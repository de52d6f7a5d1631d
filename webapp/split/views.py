"""Split learning's pages (logged-in users): the studies with the form that creates one, a
study's comparison of methods with each schedule's Gantt, and the form that trains split
learning on enrolled devices (a split run). Thin: selectors read, services
write, the templates and static/split/split.js do the rest."""

from __future__ import annotations

from itertools import groupby

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from webapp.dashboard.services import FormErrors, FormInvalid
from webapp.split import selectors, services, training

STUDIES_PER_PAGE = 50
POLL_MS = 2000


@login_required
@require_http_methods(["GET", "POST"])
def studies(request: HttpRequest) -> HttpResponse:
    """The studies, newest first, and the new-study form: on success the study's schedules are
    queued and the browser goes to its page; otherwise each error is shown by its field."""
    errors: FormErrors = {}
    if request.method == "POST":
        try:
            study = services.split_study_create_from_form(
                form=request.POST, files=request.FILES, created_by=request.user)
        except FormInvalid as exc:
            errors = exc.errors
        else:
            return redirect("split:split-study", study_id=study.pk)
    form = request.POST if request.method == "POST" else None
    page = Paginator(selectors.split_study_list(), STUDIES_PER_PAGE).get_page(
        request.GET.get("page"))
    shared = groupby(selectors.shared_instance_choices(), key=lambda c: c.file)
    return render(request, "split/studies.html", {
        "page": page, "rows": selectors.split_study_rows(page.object_list),
        "errors": errors, "form": form,
        "shared": [(file, list(choices)) for file, choices in shared],
        "methods": selectors.method_choices(),
        "chosen_methods": form.getlist("methods") if form else selectors.DEFAULT_METHODS,
        "source": form.get("source", "shared") if form else "shared",
        "limits": {"time_limit_s": services.MAX_TIME_LIMIT_S,
                   "switch_slots": services.MAX_SWITCH_SLOTS},
    })


@login_required
def study(request: HttpRequest, study_id: int) -> HttpResponse:
    found = get_object_or_404(selectors.split_study_list(), pk=study_id)
    config = {
        "study": found.pk, "poll_ms": POLL_MS,
        "statuses": {str(s.pk): s.status for s in found.schedules.all()},
        "urls": {
            "detail": reverse("split-study-detail", args=[found.pk]),
            "compare": reverse("split-study-compare", args=[found.pk]),
            "gantt": reverse("split-schedule-gantt", args=[found.pk, 0])
            .replace("/0/gantt/", "/{schedule}/gantt/"),
        },
    }
    return render(request, "split/study.html", {
        "study": found, "status": selectors.split_study_status(study=found),
        "compare": selectors.split_compare(study=found), "config": config})


@login_required
@require_http_methods(["GET", "POST"])
def train(request: HttpRequest) -> HttpResponse:
    """The form that trains split learning on devices: on success the split run is created,
    its planning queued, and the browser goes to its page; otherwise each error is shown by
    its field. ``?methods=`` ticks those methods (a study's page links here with its own)."""
    errors: FormErrors = {}
    if request.method == "POST":
        try:
            run = training.split_run_create_and_plan(form=request.POST, created_by=request.user)
        except FormInvalid as exc:
            errors = exc.errors
        else:
            return redirect("dashboard:run", run_id=run.pk)
    form = request.POST if request.method == "POST" else None
    return render(request, "split/train.html", {
        **training.split_train_context(form=form, preset=request.GET), "errors": errors})
