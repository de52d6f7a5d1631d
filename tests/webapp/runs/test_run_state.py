"""The typed run state (webapp.runs.states.Deployment, Recovery): what a run stores of its
current generation and of a recovery under way, kept apart, and the migration that split the
old ``Run.recovery`` blob holding both."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from hypothesis import given
from hypothesis import strategies as st

from webapp.runs.states import Deployment, Recovery

uids = st.text(alphabet="abcdef0123456789", min_size=1, max_size=8)
finite = st.floats(min_value=0, max_value=1e6, allow_nan=False)
plans = st.none() | st.fixed_dictionaries({"algorithm": st.just("optimal"),
                                           "stages": st.lists(st.integers(0, 9), max_size=3)})


@given(plan=plans, since=finite, restart=st.none() | finite,
       check=st.none() | st.integers(0, 10**6), capacity=st.dictionaries(uids, finite))
def test_a_deployment_reads_back_as_written(plan, since, restart, check, capacity):
    deployment = Deployment(plan=plan, since_s=since, restart_s=restart, next_check=check,
                            capacity=capacity)
    assert Deployment.from_json(deployment.to_json()) == deployment


@given(generation=st.integers(1, 10**6), lost=st.lists(uids, unique=True).map(tuple),
       paused=st.booleans(), from_start=st.booleans(), plan=plans,
       resume=st.integers(0, 10**6), wall=st.none() | finite)
def test_a_recovery_reads_back_as_written(generation, lost, paused, from_start, plan, resume,
                                          wall):
    recovery = Recovery(generation=generation, lost=lost, paused=paused, from_start=from_start,
                        next_plan=plan, resume=resume, replanned_wall=wall)
    assert Recovery.from_json(recovery.to_json()) == recovery


@pytest.mark.parametrize("raw", [{}, None, [], {"plan": {"stages": []}, "since_s": 3.0}])
def test_no_recovery_is_under_way_without_a_generation(raw):
    assert Recovery.from_json(raw) is None


def test_an_empty_deployment_has_no_plan():
    assert Deployment.from_json({}) == Deployment() and Deployment().plan is None


@pytest.mark.django_db(transaction=True)
def test_the_migration_splits_the_old_blob_into_deployment_and_recovery():
    executor = MigrationExecutor(connection)
    before, after = [("runs", "0012_shared_detection_state")], [("runs", "0013_run_deployment")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    Run, ModelSpec = old.get_model("runs", "Run"), old.get_model("devices", "ModelSpec")
    spec = ModelSpec.objects.create(model="mlp", dataset="digits", batch_size=32)
    plan = {"algorithm": "optimal", "stages": [{"layers": [0, 3], "devices": ["a"]}]}
    running = Run.objects.create(
        name="running", model_spec=spec, state="running", algorithms=[], recovery={
            "plan": plan, "since_s": 4.5, "restart_s": 1.25, "next_check": 64,
            "capacity": {"a": 0.5}})
    recovering = Run.objects.create(
        name="recovering", model_spec=spec, state="recovering", algorithms=[], recovery={
            "plan": plan, "since_s": 0.0, "generation": 2, "lost": ["b"], "cause": "failure",
            "paused": True, "next_plan": plan})
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps.get_model("runs", "Run")
    moved = new.objects.get(pk=running.pk)
    assert moved.recovery == {}
    assert Deployment.from_json(moved.deployment) == Deployment(
        plan=plan, since_s=4.5, restart_s=1.25, next_check=64, capacity={"a": 0.5})
    under_way = new.objects.get(pk=recovering.pk)
    assert Deployment.from_json(under_way.deployment).plan == plan
    recovery = Recovery.from_json(under_way.recovery)
    assert recovery is not None and "plan" not in under_way.recovery
    assert (recovery.generation, recovery.lost, recovery.paused, recovery.next_plan) == (
        2, ("b",), True, plan)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
