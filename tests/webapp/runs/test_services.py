import math
import threading

import pytest
from django.db import connection, connections
from django.test import override_settings

from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.partition import run_planner
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from tests.webapp.runs.test_events import drain, subscribe
from webapp.common.exceptions import Conflict, IllegalTransition, InvalidInput
from webapp.devices.models import Device
from webapp.runs import events, selectors, services
from webapp.runs.models import FaultEvent, MetricPoint, Plan, Run, RunDevice, TimelineEvent
from webapp.runs.services import ingest, planning

pytestmark = pytest.mark.django_db


def profiled_run(*, algorithms=("ftpipehd", "uniform"), scales=(1.0, 2.0, 0.5), **kwargs):
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in scales]
    for device, scale in zip(devices, scales, strict=True):
        LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=scale)
    return RunFactory(model_spec=spec, devices=devices, algorithms=list(algorithms), **kwargs)


# --------------------------------------------------------------------------- creation


def test_run_create_keeps_the_device_order():
    spec = ModelSpecFactory()
    a, b, c = DeviceFactory(), DeviceFactory(), DeviceFactory()
    run = services.run_create(name="r", model_spec=spec, devices=[c, a, b],
                              algorithms=["duanwu", "bsp"], microbatches=6)
    assert run.state == Run.State.DRAFT
    assert [rd.device for rd in run.run_devices.all()] == [c, a, b]
    assert run.algorithms == ["duanwu", "bsp"] and run.microbatches == 6


@pytest.mark.parametrize(("devices", "algorithms", "field", "reason"), [
    ("retired", ["bsp"], "devices[1]", "is retired"),
    ("twice", ["bsp"], "devices[1]", "repeats device"),
    ("none", ["bsp"], "devices", "must name at least one device"),
    ("ok", ["bsp", "magic"], "algorithms[1]", "unknown algorithm 'magic'; known: uniform"),
    ("ok", ["bsp", "bsp"], "algorithms[1]", "repeats 'bsp'"),
    ("ok", [], "algorithms", "must name at least one algorithm"),
])
def test_run_create_refuses_bad_devices_and_algorithms(devices, algorithms, field, reason):
    first = DeviceFactory()
    chosen = {"retired": [first, DeviceFactory(status=Device.Status.RETIRED)],
              "twice": [first, first], "none": [], "ok": [first]}[devices]
    with pytest.raises(InvalidInput) as caught:
        services.run_create(name="r", model_spec=ModelSpecFactory(), devices=chosen,
                            algorithms=algorithms)
    assert caught.value.errors[0].field == field
    assert reason in caught.value.errors[0].reason
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- planning


def test_run_plan_queues_one_task_per_algorithm_after_commit(django_capture_on_commit_callbacks):
    run = profiled_run()
    with django_capture_on_commit_callbacks() as callbacks:
        services.run_plan(run=run)
        run.refresh_from_db()
        assert run.state == Run.State.PLANNING
        assert sorted(run.plans.values_list("status", flat=True)) == ["pending", "pending"]
    planning = [c for c in callbacks if getattr(c, "func", None).__name__ == "delay"]
    assert sorted(c.args[0] for c in planning) == sorted(run.plans.values_list("pk", flat=True))


def test_planning_stores_prediction_and_simulation_and_moves_the_run_to_planned(
        django_capture_on_commit_callbacks):
    run = profiled_run(algorithms=("ftpipehd", "uniform", "duanwu"))
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED and run.error == ""
    plans = {p.algorithm: p for p in run.plans.all()}
    assert set(plans) == {"ftpipehd", "uniform", "duanwu"}
    for plan in plans.values():
        assert plan.status == Plan.Status.DONE and plan.attempts == 1
        assert plan.document["algorithm"] == plan.algorithm
        assert plan.document["microbatches"] == run.microbatches
        assert plan.period_s > 0 and plan.throughput_sps == pytest.approx(32 / plan.period_s)
        assert plan.memory_ok is True and plan.planner_s >= 0
        assert plan.simulated_throughput_sps > 0
        assert plan.simulation["microbatches"] == run.microbatches * 2  # test settings: 2 batches
        stage_devices = {d for s in plan.document["stages"] for d in s["devices"]}
        assert stage_devices <= set(plan.simulation["devices"]) | stage_devices
        assert stage_devices <= {rd.device.uid for rd in run.run_devices.all()}
        assert plan.stages == len(plan.document["stages"])
    # the simulator sees pipeline fill and drain that the steady-state cost model does not
    assert plans["ftpipehd"].simulated_throughput_sps < plans["ftpipehd"].throughput_sps
    # single-resource devices: a beta split brings nothing, and the plan says so
    assert "beta" not in plans["duanwu"].document
    assert "beta brings nothing" in plans["duanwu"].document["notes"][0]


def test_planning_fails_the_run_with_a_readable_error_when_a_profile_is_missing(
        django_capture_on_commit_callbacks):
    run = profiled_run()
    bare = DeviceFactory(name="new jetson")
    run.run_devices.create(device=bare, position=3)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert run.error.startswith("no plan could be used. ftpipehd: no profile of mlp")
    assert f"'new jetson' ({bare.uid})" in run.error
    assert set(run.plans.values_list("status", flat=True)) == {"failed"}


def test_a_plan_that_does_not_fit_in_memory_is_kept_but_the_run_fails(
        django_capture_on_commit_callbacks):
    run = profiled_run(algorithms=("bsp",))
    Device.objects.filter(run_devices__run=run).update(memory_bytes=1000)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    plan = run.plans.get()
    assert plan.status == Plan.Status.DONE and plan.memory_ok is False
    assert "does not fit in memory: device" in plan.error and "has 1,000" in plan.error
    assert run.state == Run.State.FAILED and "bsp: does not fit in memory" in run.error


def test_planning_again_replaces_the_plans(django_capture_on_commit_callbacks):
    run = profiled_run(algorithms=("uniform",))
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run, algorithms=["bsp", "ftpipehd"])
    run.refresh_from_db()
    assert run.algorithms == ["bsp", "ftpipehd"] and run.state == Run.State.PLANNED
    assert sorted(run.plans.values_list("algorithm", flat=True)) == ["bsp", "ftpipehd"]


def test_planning_a_run_that_is_planning_is_a_conflict():
    run = RunFactory(state=Run.State.PLANNING)
    with pytest.raises(IllegalTransition) as caught:
        services.run_plan(run=run)
    assert caught.value.transition == "planning -> planning"


def test_plan_compute_is_idempotent():
    run = profiled_run(algorithms=("ftpipehd",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="ftpipehd")
    assert services.plan_compute(plan_id=plan.pk)["status"] == "done"
    assert services.plan_compute(plan_id=plan.pk) == {"plan": plan.pk, "status": "skipped"}
    plan.refresh_from_db()
    assert plan.attempts == 1
    assert services.plan_compute(plan_id=10**9) == {"plan": 10**9, "status": "skipped"}


def test_a_plan_left_running_by_a_dead_worker_is_computed_again():
    run = profiled_run(algorithms=("uniform",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="uniform", status=Plan.Status.RUNNING,
                               attempts=1, worker="celery@dead")
    result = services.plan_compute(plan_id=plan.pk, worker="celery@alive")
    plan.refresh_from_db()
    run.refresh_from_db()
    assert result["status"] == "done"
    assert (plan.status, plan.attempts, plan.worker) == ("done", 2, "celery@alive")
    assert run.state == Run.State.PLANNED


def test_a_plan_of_a_cancelled_run_is_not_computed():
    run = profiled_run(algorithms=("uniform",), state=Run.State.CANCELLED)
    plan = Plan.objects.create(run=run, algorithm="uniform")
    services.plan_compute(plan_id=plan.pk)
    plan.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and plan.error == f"run {run.pk} is cancelled"
    assert plan.document is None


def test_a_crashing_planner_fails_its_plan_instead_of_leaving_the_run_planning(monkeypatch):
    run = profiled_run(algorithms=("uniform",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="uniform")

    def crash(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(planning, "run_planner", crash)
    services.plan_compute(plan_id=plan.pk)
    plan.refresh_from_db()
    run.refresh_from_db()
    assert plan.error == "the planner crashed: ZeroDivisionError: division by zero"
    assert run.state == Run.State.FAILED


def test_a_plan_that_could_not_run_fails_so_the_best_is_one_that_can(
        monkeypatch, django_capture_on_commit_callbacks):
    # every planner's plan trains on the agents; one whose schedule would not run to its end
    # (or whose stages no agent would take) fails at planning, and starting the best plan
    # never picks it
    from orchestrator.simulator import simulate

    def deadlocking(cm, plan, **kwargs):
        if plan.algorithm == "optimal":
            raise RuntimeError("the schedule deadlocks: waiting actions {'a': '0B3'}")
        return simulate(cm, plan, **kwargs)

    monkeypatch.setattr(planning, "simulate", deadlocking)
    run = profiled_run(algorithms=("optimal", "uniform", "bsp"))
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    plans = {p.algorithm: p for p in Run.objects.get(pk=run.pk).plans.all()}
    assert plans["optimal"].status == Plan.Status.FAILED
    assert plans["optimal"].error == ("the optimal plan cannot run: the schedule deadlocks: "
                                      "waiting actions {'a': '0B3'}")
    assert {plans[a].status for a in ("uniform", "bsp")} == {Plan.Status.DONE}
    best = selectors.plan_best(run=Run.objects.get(pk=run.pk))
    assert best is not None and best.algorithm != "optimal"


def test_plans_requeue_unfinished_queues_the_plans_of_planning_runs(monkeypatch):
    queued = []
    from webapp.runs import tasks

    monkeypatch.setattr(tasks.plan_compute, "delay", queued.append)
    planning = RunFactory(state=Run.State.PLANNING)
    waiting = PlanFactory(run=planning, algorithm="uniform", status="pending")
    running = PlanFactory(run=planning, algorithm="bsp", status="running")
    PlanFactory(run=planning, algorithm="ftpipehd", status="done")
    PlanFactory(run=RunFactory(state=Run.State.CANCELLED), status="pending")
    assert sorted(services.plans_requeue_unfinished()) == sorted([waiting.pk, running.pk])
    assert sorted(queued) == sorted([waiting.pk, running.pk])


# --------------------------------------------------------------------------- planning holds no lock


def in_another_connection(work):
    """Run ``work()`` on another thread, hence another database connection (the test database
    is a shared in-memory SQLite: a write there fails at once while a transaction is open)."""
    outcome = {}

    def target():
        try:
            outcome["value"] = work()
        except Exception as exc:  # handed to the test's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.mark.django_db(transaction=True)
def test_planning_holds_no_transaction_so_other_writes_proceed_meanwhile(monkeypatch):
    # Prepare: a planner that, while it plans, looks from another connection
    run = profiled_run(algorithms=("ftpipehd",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="ftpipehd")
    device = run.run_devices.first().device
    seen = {}

    def planner(*args, **kwargs):
        seen["in_transaction"] = connection.in_atomic_block
        seen["status"] = in_another_connection(
            lambda: Plan.objects.get(pk=plan.pk).status)  # the claim is committed
        seen["renamed"] = in_another_connection(
            lambda: Device.objects.filter(pk=device.pk).update(name="renamed meanwhile"))
        return run_planner(*args, **kwargs)

    monkeypatch.setattr(planning, "run_planner", planner)
    # Execute
    result = services.plan_compute(plan_id=plan.pk)
    # Assert
    assert seen == {"in_transaction": False, "status": "running", "renamed": 1}
    assert result["status"] == "done"
    assert Device.objects.get(pk=device.pk).name == "renamed meanwhile"
    assert Run.objects.get(pk=run.pk).state == Run.State.PLANNED


# --------------------------------------------------------------------------- learned planners


@pytest.mark.django_db(transaction=True)
@override_settings(PLANNING_LEARNED_EPISODES=12)
def test_a_learned_plan_commits_its_training_curve_while_it_learns(monkeypatch):
    # Prepare: every episode saved (no throttle); each episode's callback is followed by a
    # look at the row from another connection
    monkeypatch.setattr(planning, "TRAINING_SAVE_EVERY_S", 0.0)
    run = profiled_run(algorithms=("tapp",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="tapp", training={"episodes": [99]})
    old = events.run_snapshot(Run.objects.get(pk=run.pk))
    channel = subscribe(run.pk)
    committed = []

    def planner(cm, algorithm, **options):
        report = options["on_episode"]

        def on_episode(*args):
            report(*args)
            committed.append(in_another_connection(
                lambda: len(Plan.objects.get(pk=plan.pk).training["episodes"])))

        return run_planner(cm, algorithm, **{**options, "on_episode": on_episode})

    monkeypatch.setattr(planning, "run_planner", planner)
    # Execute
    assert services.plan_compute(plan_id=plan.pk)["status"] == "done"
    # Assert: one entry per episode, committed as it learned
    plan.refresh_from_db()
    assert plan.document["algorithm"] == "tapp" and plan.memory_ok is True
    curve = plan.training
    assert curve["episodes"] == list(range(1, 13)) and committed == list(range(1, 13))
    assert len(curve["best_reward"]) == len(curve["mean_reward"]) == 12
    assert all(r is not None and r < 0 for r in curve["best_reward"] + curve["mean_reward"])
    assert curve["best_reward"] == sorted(curve["best_reward"])  # the best never gets worse
    assert all(b >= m for b, m in zip(curve["best_reward"], curve["mean_reward"], strict=True))
    # the plan's step time is at most the best the training saw (the greedy plan may beat it)
    assert plan.period_s <= curve["best_reward"][-1] ** 2 * (1 + 1e-5)
    received = [m["event"] for m in drain(channel)]
    sent = [(e["plan"]["status"], len(e["plan"]["training"].get("episodes", [])))
            for e in received if e["type"] == "plan"]
    assert sent == [("running", 0), *(("running", k) for k in range(1, 13)), ("done", 12)]
    applied = old
    for event in received:
        applied = events.snapshot_apply(applied, event)
    assert applied == events.run_snapshot(Run.objects.get(pk=run.pk))
    assert applied["plans"][0]["training"] == curve


@override_settings(PLANNING_LEARNED_EPISODES=5)
def test_a_learned_plans_curve_is_saved_at_most_every_interval(monkeypatch):
    monkeypatch.setattr(planning, "TRAINING_SAVE_EVERY_S", 3600.0)
    sent = []
    monkeypatch.setattr(events, "run_event_send", lambda run_id, event: sent.append(event))
    run = profiled_run(algorithms=("tapp",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="tapp")
    services.plan_compute(plan_id=plan.pk)
    plan.refresh_from_db()
    assert plan.training["episodes"] == [1, 2, 3, 4, 5]
    lengths = [(e["plan"]["status"], len(e["plan"]["training"].get("episodes", [])))
               for e in sent if e["type"] == "plan"]
    assert lengths == [("running", 0), ("running", 1), ("done", 5)]  # first episode, the end


def test_a_learned_plan_that_fails_keeps_the_curve_it_learned(monkeypatch):
    run = profiled_run(algorithms=("tapp",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="tapp")

    def planner(cm, algorithm, *, on_episode, **options):
        on_episode(0, -1.5, -2.0)
        on_episode(1, -1.25, -1.75)
        raise ValueError("the reward diverged")

    monkeypatch.setattr(planning, "run_planner", planner)
    services.plan_compute(plan_id=plan.pk)
    plan.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and plan.error == "the reward diverged"
    assert plan.training == {"episodes": [1, 2], "best_reward": [-1.5, -1.25],
                             "mean_reward": [-2.0, -1.75]}


def test_the_other_planners_store_no_training_and_a_new_attempt_starts_a_new_curve():
    run = profiled_run(algorithms=("uniform",), state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="uniform", status=Plan.Status.RUNNING,
                               attempts=1, training={"episodes": [1], "best_reward": [-1.0],
                                                     "mean_reward": [-2.0]})
    services.plan_compute(plan_id=plan.pk)
    plan.refresh_from_db()
    assert plan.status == Plan.Status.DONE and plan.training == {}


def test_training_progress_stores_no_reward_until_a_candidate_fits_and_saves_only_its_attempt(
        monkeypatch):
    sent = []
    monkeypatch.setattr(events, "run_event_send", lambda run_id, event: sent.append(event))
    plan = PlanFactory(run=RunFactory(state=Run.State.PLANNING), algorithm="tapp",
                       status=Plan.Status.RUNNING, attempts=2)
    progress = services.TrainingProgress(plan, every_s=0.0)
    progress(0, -math.inf, 0.0)
    progress(1, -0.123456789, -0.5)
    assert Plan.objects.get(pk=plan.pk).training == {
        "episodes": [1, 2], "best_reward": [None, -0.123457], "mean_reward": [None, -0.5]}
    assert [e["plan"]["training"]["episodes"] for e in sent] == [[1], [1, 2]]
    # planned again meanwhile: this attempt no longer holds the plan, and says nothing
    Plan.objects.filter(pk=plan.pk).update(attempts=3)
    progress(2, -0.1, -0.4)
    assert len(Plan.objects.get(pk=plan.pk).training["episodes"]) == 2 and len(sent) == 2


# --------------------------------------------------------------------------- starting


@pytest.mark.django_db(transaction=True)
def test_start_takes_the_best_fitting_plan_by_default_and_deploys_it():
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(3)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, scale=1.0 + 2 * k)
    run = RunFactory(model_spec=spec, devices=devices,
                     algorithms=["uniform", "ftpipehd", "optimal"])
    services.run_plan(run=run)
    best = selectors.plan_best(run=Run.objects.get(pk=run.pk))
    services.run_start(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.STARTING and run.chosen_plan == best
    assert run.started_at is not None
    stages = {rd.device.uid: rd.stage for rd in RunDevice.objects.filter(run=run)
              if rd.stage is not None}
    planned = {d: k for k, s in enumerate(best.document["stages"]) for d in s["devices"]}
    assert stages == planned


@pytest.mark.parametrize(("change", "reason"), [
    ({"memory_ok": False}, "does not fit in the devices' memory"),
    ({"status": "failed"}, "is failed, not done"),
])
def test_start_refuses_an_unusable_plan(change, reason):
    run = RunFactory(state=Run.State.PLANNED)
    plan = PlanFactory(run=run, **change)
    with pytest.raises(InvalidInput, match=reason):
        services.run_start(run=run, plan=plan)


def test_start_refuses_another_runs_plan():
    run = RunFactory(state=Run.State.PLANNED)
    with pytest.raises(InvalidInput, match="belongs to run"):
        services.run_start(run=run, plan=PlanFactory())


def test_pause_then_start_resumes_with_the_same_plan():
    run = RunFactory(state=Run.State.RUNNING)
    plan = PlanFactory(run=run)
    Run.objects.filter(pk=run.pk).update(chosen_plan=plan)
    services.run_pause(run=run)
    resumed = services.run_start(run=run)
    assert resumed.state == Run.State.RUNNING and resumed.chosen_plan == plan
    with pytest.raises(IllegalTransition, match="cannot pause"):
        services.run_pause(run=RunFactory(state=Run.State.PLANNED))


def test_stop_cancels_and_records_the_time():
    stopped = services.run_stop(run=RunFactory(state=Run.State.RUNNING))
    assert stopped.state == Run.State.CANCELLED and stopped.finished_at is not None


# --------------------------------------------------------------------------- events in bulk


def test_tens_of_thousands_of_timeline_events_are_stored_in_bulk(django_assert_max_num_queries):
    run = RunFactory(state=Run.State.RUNNING)
    records = [TimelineRecord(run.pk, "dev-1", i % 4, "forward", i, 0, i * 0.01, i * 0.01 + 0.005)
               for i in range(30_000)]
    fields = [f for f in TimelineEvent._meta.concrete_fields if not f.primary_key]
    per_query = min(ingest.BULK_BATCH, connection.ops.bulk_batch_size(fields, records))
    with django_assert_max_num_queries(math.ceil(30_000 / per_query) + 2):
        assert len(services.timeline_events_store(run=run, records=records)) == 30_000
    assert TimelineEvent.objects.filter(run=run).count() == 30_000
    assert TimelineEvent.objects.filter(run=run).order_by("-start").first().microbatch == 29_999


def test_run_events_store_checks_everything_before_storing_anything():
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    good = {"run": run.pk, "device": device.uid, "stage": 0, "kind": "forward",
            "microbatch": 1, "version": 0, "start": 1.0, "end": 1.5}
    stored = services.run_events_store(
        run=run, device=device, timeline=[good],
        faults=[{"run": run.pk, "at": 2.0, "kind": "device_lost", "device": "x",
                 "detail": {"reason": "heartbeat timeout"}}],
        metrics=[{"at": 2.0, "kind": "loss", "value": 0.7}])
    assert stored == {"timeline": 1, "faults": 1, "metrics": 1, "refused": []}
    assert FaultEvent.objects.get().detail == {"reason": "heartbeat timeout"}
    assert MetricPoint.objects.get().value == 0.7
    cases = [
        ({"timeline": [good, {**good, "device": "someone-else"}]}, "timeline[1].device"),
        ({"timeline": [{**good, "run": run.pk + 1}]}, "timeline[0].run"),
        ({"timeline": [good, {**good, "end": 0.5}]}, "timeline[1].end"),
        ({"faults": [{"run": run.pk, "at": 1.0, "kind": "exploded"}]}, "faults[0].kind"),
    ]
    for batch, field in cases:
        with pytest.raises(InvalidInput) as caught:
            services.run_events_store(run=run, device=device, **batch)
        assert caught.value.errors[0].field == field
    assert TimelineEvent.objects.count() == 1
    # metric points are refused one by one (SQLite stores NaN as NULL: a diverged loss
    # failed the whole batch on NOT NULL, and the device's timeline events with it)
    stored = services.run_events_store(
        run=run, device=device, timeline=[{**good, "microbatch": 2}],
        metrics=[{"at": 3.0, "kind": "loss", "value": float("nan")},
                 {"at": 3.0, "kind": "loss", "value": float("inf")}, {"at": 3.0, "kind": "loss"},
                 {"at": 3.0, "kind": "accuracy", "value": 0.5}])
    assert (stored["timeline"], stored["metrics"]) == (1, 1)
    assert [r["field"] for r in stored["refused"]] == [
        "metrics[0].value", "metrics[1].value", "metrics[2].value"]
    assert TimelineEvent.objects.count() == 2 and MetricPoint.objects.count() == 2


def test_run_events_store_refuses_a_run_that_is_not_active():
    device = DeviceFactory()
    run = RunFactory(state=Run.State.PLANNED, devices=[device])
    with pytest.raises(Conflict) as caught:
        services.run_events_store(run=run, device=device, metrics=[])
    assert caught.value.state == "planned" and caught.value.action == "report events"


def test_stored_timeline_events_read_back_as_the_records_sent_live():
    # the store bypasses the ORM (one executemany); the snapshot reads rows back with the ORM:
    # a run page must see the same events either way
    run = RunFactory(state=Run.State.RUNNING)
    records = [TimelineRecord(run.pk, "dev-1", i % 3, kind, i, i // 2, i * 0.25, i * 0.25 + 0.125,
                              1000 * i) for i, kind in enumerate(["forward", "backward", "send",
                                                                  "recv", "update", "load"])]
    stored = services.timeline_events_store(run=run, records=records)
    rows = TimelineEvent.objects.filter(run=run).order_by("start")
    assert [selectors.timeline_json(r) for r in rows] == [e.to_json() for e in stored]
    assert services.timeline_events_store(run=run, records=[]) == []


def test_stored_metric_points_read_back_as_the_points_sent_live():
    # metric points too bypass the ORM; the run page's snapshot reads them with it
    run = RunFactory(state=Run.State.RUNNING)
    points = [{"at": 0.5, "kind": "loss", "value": 2.25},
              {"at": 0.75, "kind": "accuracy", "device": "dev-2", "value": 0.125},
              {"at": 1.0, "kind": "throughput_sps", "device": None, "value": 4096.0}]
    stored = services.metric_points_store(run=run, points=points)
    rows = MetricPoint.objects.filter(run=run).order_by("at")
    assert [selectors.metric_json(r) for r in rows] == stored
    assert [r.run_id for r in rows] == [run.pk] * 3 and rows[2].device == ""
    assert services.metric_points_store(run=run, points=[]) == []


def test_an_events_batch_sent_again_is_stored_once():
    # an agent sends a batch again when its connection closed before the answer: the server
    # may have stored it already, and must not store it twice
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    event = {"run": run.pk, "device": device.uid, "stage": 0, "kind": "forward",
             "microbatch": 1, "version": 0, "start": 1.0, "end": 1.5}
    first = services.run_events_store(run=run, device=device, timeline=[event],
                                      stream="a1", seq=1)
    again = services.run_events_store(run=run, device=device, timeline=[event],
                                      stream="a1", seq=1)
    assert (first["timeline"], again["timeline"]) == (1, 0)
    nxt = services.run_events_store(run=run, device=device, timeline=[
        {**event, "microbatch": 2}], stream="a1", seq=2)
    # a restarted agent starts a new stream at 1
    restarted = services.run_events_store(run=run, device=device, timeline=[
        {**event, "microbatch": 3}], stream="b7", seq=1)
    assert (nxt["timeline"], restarted["timeline"]) == (1, 1)
    assert sorted(TimelineEvent.objects.values_list("microbatch", flat=True)) == [1, 2, 3]
