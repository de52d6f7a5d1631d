"""Creating a split-learning study (every input checked, naming the field) and computing its
schedules with the real methods of orchestrator.sl."""

from __future__ import annotations

import pytest

from orchestrator.sl import check_schedule, load_instance, parse_instance, parse_schedule
from tests.conftest import ROOT
from tests.webapp.factories import UserFactory
from tests.webapp.split.factories import MNIST, SplitScheduleFactory, instance_document
from webapp.common.exceptions import InvalidInput
from webapp.split import services
from webapp.split.models import SplitSchedule, SplitStudy

pytestmark = pytest.mark.django_db


def create(**changes):
    kwargs = {"name": "s", "file": MNIST, "index": 0, "methods": ["balanced-greedy"],
              "time_limit_s": 2.0}
    kwargs.update(changes)
    return services.split_study_create(**kwargs)


# --------------------------------------------------------------------------- creation


def test_a_study_of_a_shared_instance_queues_one_pending_schedule_per_method_after_commit(
        django_capture_on_commit_callbacks):
    user = UserFactory()
    with django_capture_on_commit_callbacks() as callbacks:
        study = create(index=1, methods=["auto", "random-fcfs", "exact"], switch_slots=1,
                       seed=7, created_by=user)
    expected = load_instance(ROOT / MNIST, index=1)
    assert study.source == f"{MNIST}#1"
    assert study.instance == expected.to_json()
    assert (study.clients, study.helpers) == (expected.clients, expected.helpers)
    assert (study.switch_slots, study.seed, study.created_by) == (1, 7, user)
    schedules = list(study.schedules.order_by("id"))
    assert [s.method for s in schedules] == ["auto", "random-fcfs", "exact"]
    assert {s.status for s in schedules} == {SplitSchedule.Status.PENDING}
    assert all(c.func.__name__ == "delay" for c in callbacks)
    assert sorted(c.args[0] for c in callbacks) == [s.pk for s in schedules]


def test_a_study_of_an_uploaded_instance_keeps_the_document():
    study = create(file=None, index=None, instance=instance_document(source="my lab"))
    assert study.source == services.UPLOADED
    assert study.instance == parse_instance(instance_document(source="my lab")).to_json()
    assert (study.clients, study.helpers) == (3, 2)


def huge_clients() -> dict:
    n = services.MAX_CLIENTS + 1
    return instance_document(clients=n, **{k: [[1]] * n for k in ("r", "l", "lp", "rp")},
                             p=[[1]] * n, pp=[[1]] * n, demand=[1] * n, helpers=1,
                             capacity=[10**6])


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"name": "  "}, "name", "must not be blank"),
    ({"methods": []}, "methods", "must name at least one method"),
    ({"methods": ["auto", "magic"]}, "methods[1]",
     "unknown method 'magic'; known: exact, admm, balanced-greedy, random-fcfs, auto"),
    ({"methods": ["auto", "auto"]}, "methods[1]", "repeats 'auto'"),
    ({"time_limit_s": 0.0}, "time_limit_s", "must be more than 0 and at most 120 seconds"),
    ({"time_limit_s": 120.5}, "time_limit_s", "must be more than 0 and at most 120 seconds"),
    ({"time_limit_s": float("nan")}, "time_limit_s", "must be more than 0"),
    ({"switch_slots": -1}, "switch_slots", "must be between 0 and 100"),
    ({"switch_slots": 101}, "switch_slots", "must be between 0 and 100"),
    ({"seed": -1}, "seed", "must be between 0 and 2147483647"),
    ({"file": "data/sl/nope.jsonl"}, "file", "'data/sl/nope.jsonl' is not a shared instance"),
    ({"file": "../../etc/passwd"}, "file", "'../../etc/passwd' is not a shared instance file"),
    ({"index": 36}, "index", f"{MNIST} has 36 instances, so the index must be between 0 and 35"),
    ({"index": None}, "index", f"is required with file: which instance of {MNIST}"),
    ({"file": None}, "file", "is required with index"),
    ({"file": None, "index": None}, "instance", "give an instance document, or a shared file"),
    ({"instance": instance_document()}, "instance", "give an instance document or a shared "
                                                    "file and index, not both"),
    ({"file": None, "index": None, "instance": instance_document(p=[[2, 3], [0, 2], [2, 2]])},
     "instance.p[1][0]", "must be at least 1"),
    ({"file": None, "index": None, "instance": instance_document(rp=None)},
     "instance.rp", "must be a JSON array"),
    ({"file": None, "index": None, "instance": {"name": "x"}}, "instance.slot_ms", "is missing"),
    ({"file": None, "index": None, "instance": huge_clients()}, "instance.clients",
     "is 201; a study takes at most 200"),
    ({"file": None, "index": None, "instance": instance_document(pp=[[60000] * 2] * 3)},
     "instance", "the clients' longest chains add up to 180"),
    ({"file": None, "index": None, "instance": instance_document(demand=[10, 25, 10])},
     "instance.demand[1]", "is 25 MB but the largest helper has 20 MB"),
    ({"file": None, "index": None, "instance": instance_document(demand=[15, 15, 15])},
     "instance.demand", "adds up to 45 MB but the helpers have 40 MB in all"),
])
def test_bad_input_is_refused_naming_the_field(changes, field, reason):
    with pytest.raises(InvalidInput) as caught:
        create(**changes)
    assert caught.value.errors[0].field == field
    assert caught.value.errors[0].reason.startswith(reason), caught.value.errors[0].reason
    assert not SplitStudy.objects.exists() and not SplitSchedule.objects.exists()


# --------------------------------------------------------------------------- computing


@pytest.mark.parametrize("method", ["exact", "admm", "balanced-greedy", "random-fcfs", "auto"])
def test_each_method_stores_a_schedule_the_checker_accepts(solved, method):
    study = solved([method], switch_slots=1 if method == "auto" else 0)
    row = study.schedules.get()
    assert row.status == SplitSchedule.Status.DONE, row.error
    instance = parse_instance(study.instance)
    schedule = parse_schedule(row.schedule)
    check_schedule(instance=instance, schedule=schedule)
    assert schedule.method == method
    assert row.makespan == schedule.makespan and row.solver_s == schedule.solver_s
    assert row.lower_bound == schedule.lower_bound
    assert (method in ("exact", "auto")) == (row.lower_bound is not None)
    assert row.started_at is not None and row.finished_at >= row.started_at and row.error == ""


def test_a_study_of_a_shared_instance_is_solved(solved):
    study = solved(["balanced-greedy", "random-fcfs"], instance=None, file=MNIST, index=0,
                   seed=3)
    rows = {r.method: r for r in study.schedules.all()}
    assert {r.status for r in rows.values()} == {"done"}
    assert rows["random-fcfs"].schedule["seed"] == 3
    check_schedule(instance=load_instance(ROOT / MNIST, index=0),
                   schedule=parse_schedule(rows["balanced-greedy"].schedule))


def test_a_method_that_finds_no_schedule_stores_why(solved):
    # every client fits a helper and the total fits, but no two clients share one
    study = solved(["balanced-greedy", "exact"],
                   instance=instance_document(demand=[12, 12, 12], capacity=[20, 20]))
    for row in study.schedules.all():
        assert row.status == SplitSchedule.Status.FAILED
        assert "no assignment of the clients fits the helpers' memory" in row.error
        assert row.schedule is None and row.makespan is None and row.finished_at is not None


def test_a_crashing_method_fails_its_schedule_with_a_readable_error(solved, monkeypatch):
    def crash(**kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(services, "solve", crash)
    row = solved(["auto"]).schedules.get()
    assert row.status == SplitSchedule.Status.FAILED
    assert row.error == "the method crashed: ZeroDivisionError: division by zero"


def test_a_redelivered_task_for_a_computed_schedule_does_nothing(solved, monkeypatch):
    row = solved(["random-fcfs"]).schedules.get()
    assert row.status == SplitSchedule.Status.DONE

    def never(**kwargs):
        raise AssertionError("solved again")

    monkeypatch.setattr(services, "solve", never)
    assert services.split_schedule_compute(schedule_id=row.pk) == {
        "schedule": row.pk, "status": "skipped"}
    again = SplitSchedule.objects.get(pk=row.pk)
    assert (again.status, again.schedule, again.finished_at, again.started_at) == (
        row.status, row.schedule, row.finished_at, row.started_at)


def test_a_schedule_whose_worker_died_is_computed_again():
    row = SplitScheduleFactory(status=SplitSchedule.Status.RUNNING, makespan=None,
                               solver_s=None)
    assert services.split_schedule_compute(schedule_id=row.pk)["status"] == "done"
    row.refresh_from_db()
    assert row.status == "done" and row.makespan == row.schedule["makespan"]


def test_a_schedule_that_no_longer_exists_is_skipped():
    assert services.split_schedule_compute(schedule_id=12345)["status"] == "skipped"


def test_requeue_queues_the_unfinished_schedules(monkeypatch):
    from webapp.split import tasks

    pending = SplitScheduleFactory(status="pending", method="auto")
    running = SplitScheduleFactory(status="running", method="exact")
    SplitScheduleFactory(status="done")
    SplitScheduleFactory(status="failed")
    queued = []
    monkeypatch.setattr(tasks.split_schedule_compute, "delay", queued.append)
    assert sorted(services.split_schedules_requeue_unfinished()) == [pending.pk, running.pk]
    assert sorted(queued) == [pending.pk, running.pk]
