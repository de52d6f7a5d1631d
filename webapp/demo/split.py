"""The split-learning demo (``manage.py demo --split``): a local testbed of clients of varied
speed and links and a few fast helpers, a model profiled on every one, a split run planned
with the split-learning methods (POST /api/runs/split/), their plans compared, one trained.
Headless, it waits for the run's end and returns its summary with each round's training loss
and accuracy and the measured batch makespan against the planned one (orchestrator.sl.measured)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.schedule import MAX_MICROBATCHES
from orchestrator.sl.solve import METHODS
from webapp.demo.client import DemoError, option_error, wait_for
from webapp.demo.demo import stop_run, timed
from webapp.demo.scenario import FINAL_STATES, DemoAgent, LocalTestbed, chosen_plan
from webapp.demo.triggers import When
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, Run
from webapp.runs.split_selectors import held_out_accuracy, split_summary

SPLIT_METHODS = METHODS  # all five: exact proves its optimum of this small study in time
HEADLESS_ROUNDS = 3
INTERACTIVE_BATCHES = 10_000  # of every client: about 12 minutes of the default testbed
EVALUATED_WAIT_S = 60.0  # how long a headless demo waits for the last rounds' held-out accuracy
MAX_AGENTS = 16  # each agent is a process with torch loaded, on this machine
# the clients' devices, in turn: (slowdown, link Mbit/s or None: this machine's, latency ms)
CLIENT_KINDS = ((1.0, None, 0.0), (2.0, 20.0, 5.0), (3.0, None, 0.0), (1.5, 50.0, 2.0))


def client_agents(count: int) -> tuple[DemoAgent, ...]:
    """``count`` clients, of the CLIENT_KINDS in turn (names unlike the pipeline demo's: an
    agent keeps its enrolment under var/demo/agents/<name>)."""
    agents = []
    for k in range(count):
        slowdown, link, latency = CLIENT_KINDS[k % len(CLIENT_KINDS)]
        agents.append(DemoAgent(f"sl-client-{k + 1}", slowdown=slowdown, bandwidth_mbps=link,
                                latency_ms=latency))
    return tuple(agents)


def helper_agents(count: int) -> tuple[DemoAgent, ...]:
    """``count`` fast helpers."""
    return tuple(DemoAgent(f"sl-helper-{k + 1}") for k in range(count))


@dataclass(frozen=True)
class SplitDemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "mlp"
    dataset: str = "digits"
    batch_size: int = 32
    clients: int = 4
    helpers: int = 2
    sigma1: int = 0  # the last layer of part-1
    sigma2: int = 1  # the last layer of part-2
    batches: int = 20  # batches of every client a round
    rounds: int | None = None  # None: 3 headless, else as many as a run may train
    shard_split: str = "iid"
    algorithms: tuple[str, ...] = SPLIT_METHODS
    plan: str = "best"
    time_limit_s: float = 2.0  # each method's (exact, admm and auto use it)
    slot_ms: float = 1.0  # the study's time slot
    lr: float | None = None
    momentum: float | None = None
    headless: bool = False
    run_timeout_s: float = 900.0
    kill_agents: tuple[str, ...] = ()  # fault injection: these agents are killed (SIGKILL)
    kill_agent_at_batch: int | None = None  # once the run has trained this many batches

    def rounds_to_train(self) -> int:
        """--rounds, else 3 headless, else enough to watch until Ctrl-C: INTERACTIVE_BATCHES
        batches (each agent builds its stages' schedules for the whole run when it is
        deployed: 50,000 batches took 31 s and 200 MB more per agent)."""
        if self.rounds is not None:
            return self.rounds
        return HEADLESS_ROUNDS if self.headless else max(1, INTERACTIVE_BATCHES // self.batches)


# the API's fields (POST /api/runs/split/) by the demo's options
OPTION_OF_FIELD = {"sigma1": "--sigma1", "sigma2": "--sigma2", "batches": "--batches",
                   "epochs": "--rounds", "shard_split": "--shard-split",
                   "algorithms": "--algorithms", "time_limit_s": "--time-limit",
                   "slot_ms": "--slot-ms",
                   "clients": "--clients", "helpers": "--helpers", "lr": "--lr",
                   "momentum": "--momentum"}


def check_options(o: SplitDemoOptions) -> None:
    """What the demo checks itself (the cuts, the shard split and the methods go to the API,
    whose 400 answer option_error names)."""
    if o.clients < 1:
        raise DemoError(f"--clients must be at least 1, got {o.clients}")
    if o.helpers < 1:
        raise DemoError(f"--helpers must be at least 1, got {o.helpers}")
    if o.clients + o.helpers > MAX_AGENTS:
        raise DemoError(f"--clients and --helpers: {o.clients} + {o.helpers} agents; the demo "
                        f"starts at most {MAX_AGENTS} (each a process with torch loaded)")
    if o.batches < 1:
        raise DemoError(f"--batches must be at least 1 (batches a round), got {o.batches}")
    if o.rounds is not None and o.rounds < 1:
        raise DemoError(f"--rounds must be at least 1, got {o.rounds}")
    if o.rounds_to_train() * o.batches > MAX_MICROBATCHES:
        raise DemoError(f"--rounds and --batches: {o.rounds_to_train():,} rounds of "
                        f"{o.batches:,} batches make {o.rounds_to_train() * o.batches:,}; a "
                        f"run trains at most {MAX_MICROBATCHES:,}")
    if o.plan != "best" and o.plan not in SPLIT_METHODS:
        raise DemoError(f"--plan must be best or a split-learning method "
                        f"({', '.join(SPLIT_METHODS)}), got {o.plan!r}")
    if not 0 < o.time_limit_s <= 600:
        raise DemoError(f"--time-limit must be above 0 and at most 600 s, got "
                        f"{o.time_limit_s:g}")
    names = {a.name for a in (*client_agents(o.clients), *helper_agents(o.helpers))}
    for name in o.kill_agents:
        if name not in names:
            raise DemoError(f"--kill-agent: no agent named {name!r}; the agents: "
                            f"{', '.join(sorted(names))}")
    if bool(o.kill_agents) != (o.kill_agent_at_batch is not None):
        raise DemoError("--kill-agent NAME and --kill-agent-at-batch N go together with "
                        "--split")
    if o.kill_agent_at_batch is not None and not (
            1 <= o.kill_agent_at_batch <= o.rounds_to_train() * o.batches):
        raise DemoError(f"--kill-agent-at-batch must be from 1 to "
                        f"{o.rounds_to_train() * o.batches:,} (the batches the run trains), "
                        f"got {o.kill_agent_at_batch}")
    if o.lr is not None and not 0 < o.lr <= LR_MAX:
        raise DemoError(f"--lr must be above 0 and at most {LR_MAX:g}, got {o.lr:g}")
    if o.momentum is not None and not 0 <= o.momentum <= MOMENTUM_MAX:
        raise DemoError(f"--momentum must be from 0 to {MOMENTUM_MAX}, got {o.momentum:g}")


def create_split_run(testbed: LocalTestbed, o: SplitDemoOptions, spec: int,
                     clients: list[dict[str, Any]], helpers: list[dict[str, Any]],
                     algorithms: tuple[str, ...]) -> int:
    """POST /api/runs/split/: the run's id; a setting the API refuses is a DemoError naming
    the demo's option."""
    payload: dict[str, Any] = {
        "name": f"demo: split {o.model} on {o.dataset}, {len(clients)} clients and "
                f"{len(helpers)} helpers",
        "model_spec": spec, "clients": [d["id"] for d in clients],
        "helpers": [d["id"] for d in helpers], "algorithms": list(algorithms),
        "sigma1": o.sigma1, "sigma2": o.sigma2, "batches": o.batches,
        "epochs": o.rounds_to_train(), "shard_split": o.shard_split,
        "time_limit_s": o.time_limit_s, "slot_ms": o.slot_ms}
    for setting, value in (("lr", o.lr), ("momentum", o.momentum)):
        if value is not None:
            payload[setting] = value
    try:
        return int(testbed.api.post("/api/runs/split/", payload)["id"])
    except DemoError as exc:
        raise option_error(exc, OPTION_OF_FIELD) from None


def plan_split_run(testbed: LocalTestbed, run_id: int) -> dict[str, Any]:
    """Plan the run with each of its methods; the plans' comparison."""
    testbed.api.post(f"/api/runs/{run_id}/plan/")
    planned = testbed.wait_state(run_id, (Run.State.PLANNED, Run.State.FAILED), 300)
    if planned["state"] != Run.State.PLANNED:
        raise DemoError(f"planning failed: {planned['error']}")
    compared: dict[str, Any] = testbed.api.get(f"/api/runs/{run_id}/plans/compare/")
    compared["run"] = run_id
    return compared


def describe_plans(compared: dict[str, Any]) -> list[str]:
    """One line per method, best first: its planned batch makespan, or why it has none."""
    lines = []
    for row in compared["rows"]:
        if row["status"] != "done" or row["period_s"] is None:
            lines.append(f"  {row['algorithm']:<16} {row['status']}: {row['error'] or '-'}")
            continue
        vs = f" ({row['vs_best']:.2f}x the best)" if row["vs_best"] else ""
        lines.append(f"  {row['algorithm']:<16} batch makespan {row['period_s'] * 1000:8.1f} ms"
                     f"{vs}, solved in {row['planner_s'] or 0:.2f} s")
    return lines


def assignment(testbed: LocalTestbed, run_id: int, plan_id: int) -> str:
    """The plan's clients by helper: "sl-helper-1 serves sl-client-1, sl-client-3; ..."."""
    plans = testbed.api.get(f"/api/runs/{run_id}/plans/")
    document = next((p["document"] for p in plans if p["id"] == plan_id), None) or {}
    names = {d["uid"]: d["name"] for d in testbed.devices}
    clients, helpers = document.get("clients") or [], document.get("helpers") or []
    chosen = (document.get("schedule") or {}).get("assignment") or []
    served: dict[int, list[str]] = {}
    for j, i in enumerate(chosen):
        served.setdefault(int(i), []).append(names.get(clients[j], clients[j]))
    return "; ".join(f"{names.get(helpers[i], helpers[i])} serves {', '.join(served[i])}"
                     for i in sorted(served) if i < len(helpers))


def wait_evaluated(testbed: LocalTestbed, run_id: int, say: Callable[[str], None]) -> None:
    """Wait a little for the held-out accuracy of every round the finished run trained (a
    Celery task measures each after the round's upload); say so when some does not come."""
    run = Run.objects.get(pk=run_id)
    if run.state != Run.State.FINISHED:
        return

    def evaluated() -> bool:
        testbed.check_children()
        return len(held_out_accuracy(run)) >= run.epochs

    try:
        wait_for(evaluated, timeout_s=EVALUATED_WAIT_S, what="each round's held-out accuracy")
    except DemoError as exc:
        say(f"  {exc}: the summary has those measured")


def run_split_demo(options: SplitDemoOptions, *, say: Callable[[str], None] = print
                   ) -> dict[str, Any] | None:
    """The split demo. Headless, it returns the run's summary (split_summary); otherwise it
    runs until interrupted."""
    o = options
    check_options(o)
    algorithms = (o.algorithms if o.plan == "best" or o.plan in o.algorithms
                  else (*o.algorithms, o.plan))
    clients, helpers = client_agents(o.clients), helper_agents(o.helpers)
    say = timed(say)
    with LocalTestbed(agents=(*clients, *helpers), host=o.host, port=o.port,
                      say=say) as testbed:
        roles = testbed.devices[:len(clients)], testbed.devices[len(clients):]
        spec = int(testbed.api.post("/api/model-specs/", {
            "model": o.model, "dataset": o.dataset, "batch_size": o.batch_size})["id"])
        # the settings go to the API first: a refused one ends the demo before any work
        run_id = create_split_run(testbed, o, spec, *roles, algorithms)
        links = testbed.measure_links()
        say(f"{len(clients)} clients and {len(helpers)} helpers online, {len(links)} links "
            f"measured; profiling {o.model} on {o.dataset}")
        testbed.model_spec(model=o.model, dataset=o.dataset, batch_size=o.batch_size)
        say(f"split run {run_id}: layers 0..{o.sigma1} on the clients, {o.sigma1 + 1}.."
            f"{o.sigma2} on the helpers, the rest on the clients again; "
            f"{o.rounds_to_train():,} rounds of {o.batches} batches ({o.shard_split} shards)")
        say(f"planning with {', '.join(algorithms)} ({o.time_limit_s:g} s each at most)")
        compared = plan_split_run(testbed, run_id)
        for line in describe_plans(compared):
            say(line)
        row = chosen_plan(compared, o.plan)
        say(f"starting the {row['algorithm']} plan (planned batch makespan "
            f"{row['period_s'] * 1000:.1f} ms): {assignment(testbed, run_id, row['plan'])}")
        testbed.start(run_id, row["plan"])
        say(f"training: open {testbed.url}/runs/{run_id}/ to watch it live")
        if o.kill_agents and o.kill_agent_at_batch is not None:
            when = When(batches=o.kill_agent_at_batch)
            say(f"fault injection: {', '.join(o.kill_agents)} will be killed "
                f"{when.describe()}")
            testbed.kill_agent_at(run_id, [testbed.agent_named(n) for n in o.kill_agents], when)
        if o.headless:
            testbed.wait_state(run_id, FINAL_STATES, o.run_timeout_s)
            wait_evaluated(testbed, run_id, say)
            summary = split_summary(run=Run.objects.get(pk=run_id))
            for r in summary["rounds"]:
                if r["loss"] is not None:
                    held_out = ("" if r["test_accuracy"] is None
                                else f", held-out accuracy {r['test_accuracy']:.1%}")
                    say(f"  round {r['round'] + 1}: loss {r['loss']:.4f}, training accuracy "
                        f"{r['accuracy']:.1%}{held_out}")
            if summary["makespan_ratio"] is not None:
                say(f"  batch makespan: planned {summary['makespan_planned_s'] * 1000:.1f} ms, "
                    f"measured {summary['makespan_measured_s'] * 1000:.1f} ms (x"
                    f"{summary['makespan_ratio']:.2f}; the median batch's span over the "
                    "clients)")
            if summary["round_batch_ratio"] is not None:
                say(f"  a round's time per batch: {summary['round_batch_s'] * 1000:.1f} ms (x"
                    f"{summary['round_batch_ratio']:.2f} the planned makespan)")
            return summary
        say("Ctrl-C stops the demo" if o.rounds is not None else
            f"it trains {o.rounds_to_train():,} rounds, or until Ctrl-C stops the demo "
            "(--rounds N: N rounds)")
        try:
            while True:
                testbed.check_children()
                time.sleep(1.0)
        except KeyboardInterrupt:
            stop_run(testbed, run_id, say)
            raise
