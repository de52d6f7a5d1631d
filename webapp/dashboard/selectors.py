"""Reads for the dashboard's pages: overview counts, devices with their profiles, runs with
their progress, plans' layouts, and the run's whole timeline and metrics for the exports
(a plan's planned timelines: webapp.dashboard.planned)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet

from orchestrator.errors import FormatError, PlanningError
from orchestrator.events import EVENT_KINDS
from orchestrator.partition import DESCRIPTIONS, PLANNERS, QUICK_PLANNERS
from webapp.devices.models import Device, LayerProfile, ModelSpec
from webapp.devices.selectors import (
    device_link_list,
    device_list,
    layer_profile_list,
    model_spec_list,
)
from webapp.runs.models import (
    AGGREGATE_EVERY_MAX,
    MOMENTUM_MAX,
    RUN_DEFAULTS,
    FaultEvent,
    MetricPoint,
    Plan,
    Run,
)
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.pipelearn_selectors import pipelearn_plan_layout
from webapp.runs.selectors import plan_best, run_list
from webapp.runs.split_selectors import split_plan_layout
from webapp.runs.states import ACTIVE, Deployment, RunState
from webapp.runs.summaries import run_summary

RUNS_PER_PAGE = 50
# the run-list filters: label -> states
RUN_FILTERS: dict[str, tuple[str, ...]] = {
    "active": (RunState.PLANNING, *sorted(ACTIVE)),
    "planned": (RunState.DRAFT, RunState.PLANNED),
    "finished": (RunState.FINISHED,),
    "failed": (RunState.FAILED, RunState.CANCELLED),
}


# --------------------------------------------------------------------------- overview


def overview_counts() -> dict[str, int]:
    """How many devices are in each status and how many runs are active."""
    by_status = dict(Device.objects.values_list("status").annotate(n=Count("id")))
    # a busy device (training) is online too: "online" counts every device with its agent
    # connected, "busy" those of them training
    return {"online": by_status.get(Device.Status.ONLINE, 0) + by_status.get(Device.Status.BUSY, 0),
            "busy": by_status.get(Device.Status.BUSY, 0),
            "offline": by_status.get(Device.Status.OFFLINE, 0),
            "devices": sum(n for s, n in by_status.items() if s != Device.Status.RETIRED),
            "active_runs": Run.objects.filter(state__in=RUN_FILTERS["active"]).count(),
            "runs": Run.objects.count()}


# --------------------------------------------------------------------------- devices


def device_profiles(*, device: Device) -> list[dict[str, Any]]:
    """The device's measured profiles, one per model spec: per-layer forward and backward
    seconds (the device page's chart)."""
    out = []
    for profile in layer_profile_list(device_id=device.pk).order_by(
            "model_spec__model", "model_spec__dataset", "model_spec__batch_size"):
        spec = profile.model_spec
        layers = profile.document.get("layers", [])
        out.append({"id": profile.pk, "model_spec": spec.pk, "label": str(spec),
                    "measured_at": profile.measured_at.isoformat(),
                    "forward_s": profile.forward_s, "backward_s": profile.backward_s,
                    # as a run measured them (None: none did)
                    "overhead_s": profile.overhead_s, "message_s": profile.message_s,
                    "layers": [{"name": la.get("name", f"layer {i}"), "kind": la.get("kind", ""),
                                "forward_s": la["forward_s"], "backward_s": la["backward_s"]}
                               for i, la in enumerate(layers)]})
    return out


def link_rows(links: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"source": link.source.uid, "source_name": link.source.name,
             "target": link.target.uid, "target_name": link.target.name,
             "bandwidth_bps": link.bandwidth_bps, "latency_s": link.latency_s,
             "measured_at": link.measured_at.isoformat()} for link in links]


def links_all() -> list[dict[str, Any]]:
    """Every measured link between two devices (as its source's agent measured it)."""
    return link_rows(device_link_list().order_by("source__name", "target__name"))


def device_links(*, device: Device) -> list[dict[str, Any]]:
    """The measured links from and to ``device``."""
    return link_rows(device_link_list().filter(Q(source=device) | Q(target=device))
                     .order_by("source__name", "target__name"))


def device_runs(*, device: Device, limit: int = 20) -> list[Run]:
    return list(run_list(device=device).select_related("model_spec")[:limit])


# --------------------------------------------------------------------------- runs


def run_page(*, state_filter: str | None) -> QuerySet[Run]:
    """The runs of the run list, newest first, optionally one filter's states."""
    runs = run_list().select_related("model_spec")
    if state_filter in RUN_FILTERS:
        runs = runs.filter(state__in=RUN_FILTERS[state_filter])
    return runs


def run_filter_counts() -> dict[str, int]:
    counts = Run.objects.aggregate(
        all=Count("id"),
        **{name: Count("id", filter=Q(state__in=states)) for name, states in RUN_FILTERS.items()})
    return {name: counts[name] or 0 for name in ("all", *RUN_FILTERS)}


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    label: str

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 0.0


def run_progress(runs: Iterable[Run]) -> dict[int, Progress]:
    """How far each run is: plans computed while planning; micro-batches whose backward pass
    finished on the first stage (micro-batches are numbered through the run) while it trains;
    everything once finished. One small query per planning or training run."""
    out: dict[int, Progress] = {}
    for run in runs:
        if run.state in (RunState.PLANNING, RunState.PLANNED):
            statuses = list(Plan.objects.filter(run=run).values_list("status", flat=True))
            done = sum(1 for s in statuses if s in (Plan.Status.DONE, Plan.Status.FAILED))
            out[run.pk] = Progress(done, len(statuses), f"{done}/{len(statuses)} plans")
            continue
        total = run.total_microbatches
        if run.state == RunState.FINISHED:
            out[run.pk] = Progress(total, total, "done")
            continue
        if run.state not in ACTIVE and run.started_at is None:
            continue
        latest = (TimelineRow.objects.filter(run=run, kind="backward", stage=0)
                  .order_by("-start").values_list("microbatch", flat=True).first())
        done = min(total, latest + 1) if latest is not None else 0
        out[run.pk] = Progress(done, total, f"{done}/{total} micro-batches")
    return out


# the new-run form's settings, shown at the run's own defaults until the user changes them
RUN_FORM_DEFAULTS = ("microbatches", "batches", "lr", "momentum", "vertical_sync",
                     "aggregate_every", "chain_every", "global_every", "repartition_after",
                     "repartition_every", "recovery_policy")


def new_run_choices() -> dict[str, Any]:
    """What the new-run form offers: model specs (with how many devices profiled each),
    devices that can train (not retired; with the model specs they profiled), planners, and
    the run's defaults of its settings and the momentum's and aggregation's limits."""
    specs = list(model_spec_list().annotate(profiled=Count("profiles")))
    devices = list(device_list().exclude(status=Device.Status.RETIRED)
                   .prefetch_related("profiles"))
    return {
        "specs": specs,
        "devices": [{"device": d, "specs": sorted(p.model_spec_id for p in d.profiles.all())}
                    for d in devices],
        "planners": [{"name": name, "description": DESCRIPTIONS.get(name, ""),
                      "quick": name in QUICK_PLANNERS} for name in PLANNERS],
        "default_planners": list(QUICK_PLANNERS),
        "defaults": {name: RUN_DEFAULTS[name] for name in RUN_FORM_DEFAULTS},
        "momentum_max": MOMENTUM_MAX,
        "aggregate_every_max": AGGREGATE_EVERY_MAX,
    }


def devices_without_profile(*, model_spec: ModelSpec, devices: Iterable[Device]) -> list[int]:
    """Positions of the devices that have not profiled ``model_spec`` (planning needs them)."""
    chosen = list(devices)
    profiled = set(LayerProfile.objects.filter(model_spec=model_spec, device__in=chosen)
                   .values_list("device_id", flat=True))
    return [k for k, d in enumerate(chosen) if d.pk not in profiled]


def run_export_plan(*, run: Run, plan_id: int | None = None
                    ) -> tuple[dict[str, Any], str] | None:
    """The plan document to export and what to call it: the given plan, else the plan the
    run's devices train now (after a re-partition or a recovery, the current generation's,
    not the one it started with), else its chosen plan, else its best."""
    if plan_id is not None:
        plan = Plan.objects.filter(run=run, pk=plan_id, document__isnull=False).first()
    else:
        current = Deployment.from_json(run.deployment).plan
        if run.generation > 0 and current is not None:
            return dict(current), f"generation-{run.generation}"
        plan = (Plan.objects.filter(pk=run.chosen_plan_id).first()
                if run.chosen_plan_id is not None else plan_best(run=run))
    if plan is None or plan.document is None:
        return None
    return plan.document, plan.algorithm


# --------------------------------------------------------------------------- plan layouts


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 stage``, ``2 stages``."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def _layers_text(layers: Any) -> str:
    if (not isinstance(layers, (list, tuple)) or len(layers) != 2
            or not all(isinstance(x, int) for x in layers)):
        return "layers ?"
    a, e = layers
    return f"layer {a}" if a == e else f"layers {a}\u2013{e}"


def _fraction(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _beta_of(raw: Any) -> list[dict[str, Any]]:
    """A device's beta as [{resource, forward, text}], in resource order: the fraction of
    each resource its forward pass gets (the backward pass gets the rest)."""
    if not isinstance(raw, dict):
        return []
    out = []
    for kind in sorted(raw, key=str):
        share = _fraction(raw[kind])
        if share is None:
            continue
        out.append({"resource": str(kind), "forward": share,
                    "text": f"\u03b2 {kind} {share:.2f} forward"})
    return out


def plan_layout(*, document: Any, names: dict[str, str], plan: Plan | None = None
                ) -> dict[str, Any]:
    """How a plan lays the model out, in words for the pages: its stages in pipeline order,
    each with its layers and the group of devices serving it (replicas of the stage, side by
    side), each device's beta (a Duan-Wu split of its resources between the forward and the
    backward pass; a device absent from a plan's beta runs its passes one after the other),
    and the planner's notes. ``names`` maps device uids to the names shown. Tolerant of
    documents from older or foreign planners: what is missing is left out, not guessed."""
    doc = document if isinstance(document, dict) else {}
    if doc.get("kind") == "split":
        return split_plan_layout(document=doc, names=names, plan=plan)
    if doc.get("kind") == "pipelearn":
        return pipelearn_plan_layout(document=doc, names=names, plan=plan)
    raw_beta = doc.get("beta")
    has_beta = isinstance(raw_beta, dict) and bool(raw_beta)
    stages = []
    for k, raw in enumerate(doc.get("stages") or []):
        if not isinstance(raw, dict):
            continue
        devices = []
        for uid in raw.get("devices") or []:
            uid = str(uid)
            beta = _beta_of(raw_beta.get(uid)) if has_beta else []
            sequential = has_beta and not beta
            passes = (", ".join(b["text"] for b in beta) if beta
                      else "forward, then backward (no \u03b2)" if sequential else "")
            devices.append({"device": uid, "label": names.get(uid, uid), "beta": beta,
                            "sequential": sequential, "passes": passes})
        n = len(devices)
        text = _layers_text(raw.get("layers")) + " on " + (
            " + ".join(d["label"] for d in devices) or "no device")
        if n > 1:
            text += f" ({n} replicas)"
        stages.append({"stage": k, "layers": raw.get("layers"), "devices": devices,
                       "replicas": n, "text": text})
    notes = doc.get("notes")
    if isinstance(notes, str):
        notes = [notes]
    notes = [str(n).strip() for n in notes or [] if isinstance(n, (str, int, float))
             and str(n).strip()] if isinstance(notes, list) else []
    replicated = sum(1 for s in stages if s["replicas"] > 1)
    summary = plural(len(stages), "stage")
    if replicated:
        summary += f" ({replicated} replicated)"
    return {"plan": plan.pk if plan else None,
            "algorithm": plan.algorithm if plan else str(doc.get("algorithm", "")),
            "stages": stages, "summary": summary, "beta": has_beta, "notes": notes}


def run_device_names(*, run: Run) -> dict[str, str]:
    return {rd.device.uid: rd.device.name for rd in run.run_devices.select_related("device")}


def run_plan_layouts(*, run: Run) -> list[dict[str, Any]]:
    """The layout of each of the run's plans that has a document, in plan order."""
    names = run_device_names(run=run)
    return [plan_layout(document=p.document, names=names, plan=p)
            for p in Plan.objects.filter(run=run, document__isnull=False).order_by("id")]


# --------------------------------------------------------------------------- exports

# The trace's threads: one lane per kind of event (a device's sends to two neighbours can
# overlap, so a kind gets further lanes when its events overlap).
TRACE_LANES = {kind: k + 1 for k, kind in enumerate(EVENT_KINDS)}
TRACE_CHUNK = 5000


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


class ChromeTrace:
    """A run's timeline as Chrome trace events (the format Perfetto and chrome://tracing
    open): an "X" complete event per timeline event (ts and dur in microseconds), one process
    per device (pid in pipeline order, named by process_name metadata) with one thread per
    kind of event, "i" instant events for faults and "C" counters for the metrics; run-wide
    faults and metrics go to process 0, named after the run. A device's process names its id
    in its args (``device``), which ``python -m orchestrator report`` reads."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.pids: dict[str, int] = {}
        self.names: dict[str, str] = {}
        for rd in run.run_devices.all():
            self.pids[rd.device.uid] = rd.position + 1
            self.names[rd.device.uid] = rd.device.name
        self.lanes: dict[tuple[int, str], list[float]] = {}
        self.threads: dict[tuple[int, int], str] = {}
        self.run_wide = False

    def pid(self, device: str) -> int:
        if not device:
            self.run_wide = True
            return 0
        if device not in self.pids:
            self.pids[device] = max(self.pids.values(), default=0) + 1
        return self.pids[device]

    def tid(self, pid: int, kind: str, start: float, end: float) -> int:
        ends = self.lanes.setdefault((pid, kind), [])
        lane = next((i for i, free_at in enumerate(ends) if free_at <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        tid = TRACE_LANES.get(kind, len(TRACE_LANES) + 1) * 100 + lane
        self.threads[(pid, tid)] = kind if lane == 0 else f"{kind} ({lane + 1})"
        return tid

    def events(self) -> Iterator[dict[str, Any]]:
        rows = (TimelineRow.objects.filter(run=self.run).order_by("start", "id")
                .values_list("device", "stage", "kind", "microbatch", "version", "start", "end",
                             "bytes", "pipeline"))
        for device, stage, kind, mb, version, start, end, size, pipeline in rows.iterator(
                TRACE_CHUNK):
            pid = self.pid(device)
            yield {"name": f"{kind} {mb}", "cat": kind, "ph": "X", "ts": _us(start),
                   "dur": _us(end - start), "pid": pid, "tid": self.tid(pid, kind, start, end),
                   "args": {"stage": stage, "microbatch": mb, "version": version,
                            "bytes": size, **({"pipeline": pipeline} if pipeline else {})}}
        for at, kind, device, detail in (FaultEvent.objects.filter(run=self.run)
                                         .order_by("at", "id")
                                         .values_list("at", "kind", "device", "detail")):
            yield {"name": kind, "cat": "fault", "ph": "i", "ts": _us(at),
                   "pid": self.pid(device), "tid": 0, "s": "p" if device else "g",
                   "args": detail or {}}
        for at, kind, device, value in (MetricPoint.objects.filter(run=self.run)
                                        .order_by("at", "id")
                                        .values_list("at", "kind", "device", "value")
                                        .iterator(TRACE_CHUNK)):
            yield {"name": kind, "cat": "metric", "ph": "C", "ts": _us(at),
                   "pid": self.pid(device), "args": {kind: value}}

    def metadata(self) -> Iterator[dict[str, Any]]:
        if self.run_wide:
            yield {"name": "process_name", "ph": "M", "pid": 0,
                   "args": {"name": f"run {self.run.pk}: {self.run.name}"}}
        for uid, pid in sorted(self.pids.items(), key=lambda item: item[1]):
            label = self.names.get(uid)
            yield {"name": "process_name", "ph": "M", "pid": pid,
                   "args": {"name": f"{label} ({uid})" if label else uid, "device": uid}}
            yield {"name": "process_sort_index", "ph": "M", "pid": pid,
                   "args": {"sort_index": pid}}
        for (pid, tid), name in sorted(self.threads.items()):
            yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                   "args": {"name": name}}
            yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                   "args": {"sort_index": tid}}


def run_metric_rows(*, run: Run) -> Iterator[tuple[float, str, str, float]]:
    """Every metric point of the run, in time order: (at_s, kind, device, value)."""
    return (MetricPoint.objects.filter(run=run).order_by("at", "kind", "device", "id")
            .values_list("at", "kind", "device", "value").iterator(TRACE_CHUNK))


# --------------------------------------------------------------------------- comparing runs

COMPARE_MIN, COMPARE_MAX = 2, 6


def runs_compare_ids(raw: list[str]) -> list[int]:
    """The run ids of ``?runs=`` (repeated or comma-separated; each once, in the order
    given); ValueError says what is wrong."""
    ids: list[int] = []
    for value in raw:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                raise ValueError(f"runs: {part!r} is not a run number")
            if int(part) not in ids:
                ids.append(int(part))
    if not COMPARE_MIN <= len(ids) <= COMPARE_MAX:
        raise ValueError(f"runs: choose between {COMPARE_MIN} and {COMPARE_MAX} runs to compare, "
                         f"got {len(ids)}")
    return ids


def runs_compared(runs: list[Run]) -> list[dict[str, Any]]:
    """Each run with its figures (webapp.runs.summaries.run_summary: measured against the
    simulator for the same plan and length, idle per device, loss), its chosen plan's layout
    and its throughput over time; the best measured throughput is marked."""
    rows = []
    for run in runs:
        try:
            summary = run_summary(run=run)
            error = ""
        except (PlanningError, FormatError) as exc:  # its devices' profiles changed since
            summary, error = {}, str(exc)
        measured = summary.get("throughput_steady_sps") or 0.0
        predicted = summary.get("throughput_steady_predicted_sps") or 0.0
        idle = summary.get("idle_s", {})
        plan = run.chosen_plan
        rows.append({
            "run": run, "summary": summary, "error": error,
            "layout": None if plan is None or plan.document is None else plan_layout(
                document=plan.document, names=run_device_names(run=run), plan=plan),
            "ratio": measured / predicted if measured and predicted else None,
            "idle_fraction": {d: f["idle_s"] / (f["busy_s"] + f["idle_s"])
                              for d, f in idle.items() if f["busy_s"] + f["idle_s"] > 0},
            "throughput": list(MetricPoint.objects.filter(
                run=run, kind=MetricPoint.Kind.THROUGHPUT_SPS, device="")
                .order_by("at").values_list("at", "value")),
            # a split or PipeLearn run's averaged model on the held-out set, each round
            "held_out": list(MetricPoint.objects.filter(
                run=run, kind=MetricPoint.Kind.TEST_ACCURACY)
                .order_by("at").values_list("value", flat=True)),
        })
    best = max((r["summary"].get("throughput_steady_sps") or 0.0 for r in rows), default=0.0)
    for r in rows:
        r["best"] = best > 0 and (r["summary"].get("throughput_steady_sps") or 0.0) == best
    return rows
