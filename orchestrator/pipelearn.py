"""PipeLearn's time model and its choice of split point P and parallel batch number N.

Zhang, Rodgers, Kilpatrick, Spence and Varghese, "PipeLearn: Pipeline Parallelism for
Collaborative Machine Learning" (arXiv:2302.12803; journal version "PiPar", JPDC 2024). A
device keeps layers ``[0, P)`` of the model and the server layers ``[P, L)``; one iteration
splits the batch of B samples into N micro-batches, the device runs the N forward passes back
to back, each activation is uploaded as soon as it is ready, the server runs forward and
backward of each micro-batch as it arrives, each gradient is downloaded, and the device runs
the N backward passes once its forwards are done. Reconstructed from the paper and the
authors' released code (``util/profile.py``); where this module differs, it says so.

Equations 5-10, the stage times of device k with split P for one batch of B samples (profile
times are for ``b0 = profile.batch_size`` samples and scale linearly, ``r = B / b0``); each
micro-batch takes 1/N of them::

    (5)  T_df(P) = r * sum_{l<P}  f_k[l]            device forward
    (6)  T_up(P) = r * o[P-1] / up_k                activation upload
    (7)  T_sf(P) = r * sigma * sum_{l>=P} f_s[l]    server forward
    (8)  T_sb(P) = r * sigma * sum_{l>=P} b_s[l]    server backward
    (9)  T_dn(P) = r * o[P-1] / down_k              gradient download (same size)
    (10) T_db(P) = r * sum_{l<P}  b_k[l]            device backward (+ its update)

``f_k``/``b_k`` are the device's own ``layer_times`` (else reference / speed), ``o`` the layers'
``output_bytes``, ``up_k``/``down_k`` the device's ``uplink_bps``/``downlink_bps`` and sigma
the server-contention slowdown (below). A transfer's data arrives ``latency_s`` (the larger of
the two devices') after it leaves the link: an edge delay, not link occupancy. The paper has
no latency; with ``latency_s = 0`` the model is the paper's.

Table I, the precedence between the stages of micro-batches i = 1..N (:data:`TABLE_I`)::

    device forward i   after device forward i-1
    upload i           after device forward i, upload i-1
    server forward i   after upload i (+ latency), server backward i-1
    server backward i  after server forward i
    download i         after server backward i, download i-1
    device backward i  after download i (+ latency), device backward i-1;
                       device backward 1 after device forward N

The last edge is the device's own order (all forwards, then all backwards); the authors' code
omits it, which lets a backward overlap a forward on one processor. The iteration time is the
longest path of this DAG, :func:`iteration_time` computes it by dynamic programming in O(N)
(the authors' code recurses over all paths, exponential in N). Summing over the path, with
``F, U, S = T_sf + T_sb, D, Bd`` the totals, ``M`` the largest and ``lam`` the latency, it is
(:func:`closed_form_iteration_time`)::

    T(N) = max(F + Bd, 2 lam + M + (F + U + S + D + Bd - M) / N)

Equation 14, the parallel batch number (:func:`parallel_batches_eq14`): the device's remaining
forward passes must cover the first micro-batch's round trip, ``(N-1) F/N >= (U + S + D)/N``::

    N = ceil((T_up + T_sf + T_sb + T_dn) / min(T_df, T_db)) + 1

then, as in the authors' code, raised to ``B // (B // N)`` (the largest N with the same
micro-batch size). When the device is the bottleneck and the latency is zero, this N is exactly
the smallest N that reaches the DAG's optimum ``F + Bd``. When the network or the server is the
bottleneck it is not: ``T(N)`` keeps falling as ``(Sum - M) / N``, and eq. 14 alone can be 24%
(shared profiles) to 30% (random ones) slower than the best N (``bench/pipelearn.py``). Rule
``"saturated"`` (the default; a deviation) therefore takes the larger of eq. 14 and the
smallest N whose T(N) is within ``tolerance`` of ``T(inf)``, from the closed form; rule
``"eq14"`` is the paper's alone. For each P in 1..L-1 the rule gives N and the best (P, N) by
:func:`iteration_time` is chosen; :func:`exhaustive_split` tries every P and every N
in 1..B.

Server contention (the paper's Figure 3(c)): the server keeps one replica of the server-side
model per client and runs them in parallel. On a server whose per-layer times are those of one
replica alone, ``K`` replicas sharing ``parallelism`` equal lanes each run at
``min(1, parallelism / K)`` of its speed: sigma = ``max(1, K / parallelism)``
(:func:`server_slowdown`). This assumes every replica busy at once, an upper bound on
contention when replicas are often idle.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

from orchestrator.cost import CostModel

STAGES = ("device_forward", "upload", "server_forward", "server_backward", "download",
          "device_backward")
"""The six stages of a micro-batch, in the order of one micro-batch's path."""

Rule = Literal["saturated", "eq14"]
RULES: tuple[Rule, ...] = ("saturated", "eq14")
DEFAULT_TOLERANCE = 0.01


@dataclass(frozen=True)
class Precedence:
    """One row of Table I: ``stage`` of micro-batch i waits for ``after`` of micro-batch
    ``i + offset``; ``latency`` if that dependency crosses the network."""

    stage: str
    after: str
    offset: int
    latency: bool = False


TABLE_I: tuple[Precedence, ...] = (
    Precedence("device_forward", "device_forward", -1),
    Precedence("upload", "device_forward", 0),
    Precedence("upload", "upload", -1),
    Precedence("server_forward", "upload", 0, latency=True),
    Precedence("server_forward", "server_backward", -1),
    Precedence("server_backward", "server_forward", 0),
    Precedence("download", "server_backward", 0),
    Precedence("download", "download", -1),
    Precedence("device_backward", "download", 0, latency=True),
    Precedence("device_backward", "device_backward", -1),
)
"""Table I; plus device backward 0 after device forward N-1 (see :func:`dag_edges`)."""

Node = tuple[str, int]


@dataclass(frozen=True)
class Edge:
    before: Node
    after: Node
    delay_s: float


@dataclass(frozen=True)
class StageTimes:
    """Equations 5-10: the time of each stage for the whole batch of one device (seconds), and
    the latency of a transfer; ``pass_s``, what each stage of :data:`STAGES` costs per
    micro-batch beyond its share of the batch (a pass's fixed overhead and its messages, as
    the runtime measures them: overhead_s, message_s; 0 in the paper's model)."""

    device_forward_s: float
    upload_s: float
    server_forward_s: float
    server_backward_s: float
    download_s: float
    device_backward_s: float
    latency_s: float = 0.0
    pass_s: tuple[float, ...] = (0.0,) * 6

    def __post_init__(self) -> None:
        for f in fields(self):
            values = getattr(self, f.name)
            for value in (values if f.name == "pass_s" else (values,)):
                if not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value < 0:
                    raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")
        if len(self.pass_s) != len(STAGES):
            raise ValueError(f"pass_s needs one time per stage ({len(STAGES)}), got "
                             f"{len(self.pass_s)}")

    @property
    def fixed(self) -> bool:
        """Does a micro-batch cost something of its own (then more of them is not free)?"""
        return any(self.pass_s)

    def micro_s(self, stage: str, parallel_batches: int) -> float:
        """One micro-batch's time in ``stage`` when the batch is split in that many."""
        return self.of(stage) / parallel_batches + self.pass_s[STAGES.index(stage)]

    def device_busy_s(self, parallel_batches: int) -> float:
        """The device's compute time of one iteration of that many micro-batches."""
        return self.device_s + parallel_batches * (self.pass_s[0] + self.pass_s[5])

    def server_busy_s(self, parallel_batches: int) -> float:
        """The server replica's compute time of one iteration."""
        return self.server_s + parallel_batches * (self.pass_s[2] + self.pass_s[3])

    def of(self, stage: str) -> float:
        """The whole-batch time of one of :data:`STAGES`."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
        value: float = getattr(self, f"{stage}_s")
        return value

    @property
    def server_s(self) -> float:
        return self.server_forward_s + self.server_backward_s

    @property
    def device_s(self) -> float:
        return self.device_forward_s + self.device_backward_s

    @property
    def resources(self) -> tuple[float, ...]:
        """Per-iteration totals of the five resources a micro-batch crosses in order: device
        forward, uplink, server, downlink, device backward."""
        return (self.device_forward_s, self.upload_s, self.server_s, self.download_s,
                self.device_backward_s)

    def to_json(self) -> dict[str, float | list[float]]:
        out: dict[str, float | list[float]] = {f.name: getattr(self, f.name)
                                               for f in fields(self) if f.name != "pass_s"}
        if self.fixed:
            out["pass_s"] = list(self.pass_s)
        return out


def _check_n(parallel_batches: int) -> None:
    if isinstance(parallel_batches, bool) or not isinstance(parallel_batches, int) \
            or parallel_batches < 1:
        raise ValueError(f"parallel_batches must be an integer >= 1, got {parallel_batches!r}")


def dag_edges(*, stages: StageTimes, parallel_batches: int) -> tuple[Edge, ...]:
    """Every precedence edge of one iteration's stage DAG (Table I unrolled over N)."""
    _check_n(parallel_batches)
    n = parallel_batches
    out = [Edge(("device_forward", n - 1), ("device_backward", 0), 0.0)]
    for i in range(n):
        for p in TABLE_I:
            j = i + p.offset
            if 0 <= j < n:
                out.append(Edge((p.after, j), (p.stage, i), stages.latency_s if p.latency else 0.0))
    return tuple(out)


def iteration_time(*, stages: StageTimes, parallel_batches: int) -> float:
    """Longest path of the stage DAG (end of device backward N): O(N) dynamic programming over
    the recurrences of Table I, each stage taking 1/N of its whole-batch time."""
    _check_n(parallel_batches)
    n = parallel_batches
    f, u, sf, sb, d, b = (stages.micro_s(s, n) for s in STAGES)
    lam = stages.latency_s
    upload = server = download = 0.0
    backward = n * f  # device backward 0 waits for the last device forward
    for i in range(n):
        upload = max((i + 1) * f, upload) + u
        server = max(upload + lam, server) + sf + sb
        download = max(server, download) + d
        backward = max(download + lam, backward) + b
    return backward


def asap_schedule(*, stages: StageTimes,
                  parallel_batches: int) -> dict[Node, tuple[float, float]]:
    """Start and end of every stage of every micro-batch when each starts as soon as Table I
    allows: a longest-path pass in topological order over :func:`dag_edges` (O(N))."""
    edges = dag_edges(stages=stages, parallel_batches=parallel_batches)
    n = parallel_batches
    nodes = [(s, i) for s in STAGES for i in range(n)]
    incoming: dict[Node, list[Edge]] = {v: [] for v in nodes}
    outgoing: dict[Node, list[Edge]] = {v: [] for v in nodes}
    for e in edges:
        incoming[e.after].append(e)
        outgoing[e.before].append(e)
    waiting = {v: len(incoming[v]) for v in nodes}
    ready = deque(v for v in nodes if waiting[v] == 0)
    out: dict[Node, tuple[float, float]] = {}
    while ready:
        v = ready.popleft()
        start = max((out[e.before][1] + e.delay_s for e in incoming[v]), default=0.0)
        out[v] = (start, start + stages.micro_s(v[0], n))
        for e in outgoing[v]:
            waiting[e.after] -= 1
            if waiting[e.after] == 0:
                ready.append(e.after)
    if len(out) != len(nodes):
        raise ValueError("the stage DAG has a cycle")  # Table I is acyclic: a guard for edits
    return out


def closed_form_iteration_time(*, stages: StageTimes, parallel_batches: int) -> float:
    """The longest path summed in closed form (module docstring); equals
    :func:`iteration_time`."""
    _check_n(parallel_batches)
    n = parallel_batches
    f, u, sf, sb, d, b = (stages.micro_s(s, n) for s in STAGES)
    per = (f, u, sf + sb, d, b)  # one micro-batch on each resource
    top = max(per)
    through_server = 2 * stages.latency_s + n * top + sum(per) - top
    return max(n * (f + b), through_server)


def _same_minibatch(n: int, batch_size: int) -> int:
    """The largest count of micro-batches with the same size ``B // n`` (authors' rounding)."""
    n = min(max(n, 1), batch_size)
    return batch_size // (batch_size // n)


def _check_batch(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def parallel_batches_eq14(*, stages: StageTimes, batch_size: int) -> int:
    """Equation 14: enough micro-batches that the device's forward passes cover the first
    micro-batch's round trip; in 1..B, rounded as the authors' code does."""
    _check_batch(batch_size)
    device = min(stages.device_forward_s, stages.device_backward_s)
    trip = stages.upload_s + stages.server_s + stages.download_s
    if device <= 0:
        return batch_size if trip > 0 else 1
    ratio = trip / device
    return _same_minibatch(math.ceil(ratio) + 1 if ratio < batch_size else batch_size,
                           batch_size)


def parallel_batches_within(*, stages: StageTimes, batch_size: int, tolerance: float) -> int:
    """The smallest N in 1..B whose closed-form time is within ``tolerance`` of the time with
    infinitely many micro-batches (B if none is)."""
    _check_batch(batch_size)
    if not math.isfinite(tolerance) or tolerance <= 0:
        raise ValueError(f"tolerance must be a number > 0, got {tolerance!r}")
    res = stages.resources
    top = max(res)
    rest = sum(res) - top
    if rest <= 0:
        return 1
    limit = max(stages.device_s, 2 * stages.latency_s + top)
    slack = (1 + tolerance) * limit - 2 * stages.latency_s - top
    ratio = rest / slack if slack > 0 else math.inf
    n = math.ceil(ratio) if ratio < batch_size else batch_size
    while n > 1 and closed_form_iteration_time(stages=stages, parallel_batches=n - 1) \
            <= (1 + tolerance) * limit:
        n -= 1  # guard against ceil() of a value a rounding error above an integer
    return n


def parallel_batches_fastest(*, stages: StageTimes, batch_size: int, tolerance: float) -> int:
    """With a cost per micro-batch, more micro-batches stop paying once each costs more than
    it overlaps: the smallest N in 1..B (with the same micro-batch size as the next) whose
    closed-form time is within ``tolerance`` of the least over 1..B (O(B)). Only the N that
    the authors' rounding keeps (the largest N of each micro-batch size) are candidates."""
    _check_batch(batch_size)
    times = {n: closed_form_iteration_time(stages=stages, parallel_batches=n)
             for n in sorted({_same_minibatch(k, batch_size)
                              for k in range(1, batch_size + 1)})}
    best = min(times.values())
    return min(n for n, t in times.items() if t <= (1 + tolerance) * best)


def parallel_batches(*, stages: StageTimes, batch_size: int, rule: Rule = "saturated",
                     tolerance: float = DEFAULT_TOLERANCE) -> int:
    """N for one split by ``rule``: ``"eq14"`` (the paper) or ``"saturated"`` (the larger of
    eq. 14 and :func:`parallel_batches_within`; with a cost per micro-batch, which makes the
    time grow again past some N, :func:`parallel_batches_fastest`)."""
    n = parallel_batches_eq14(stages=stages, batch_size=batch_size)
    if rule == "eq14":
        return n
    if rule != "saturated":
        raise ValueError(f"unknown rule {rule!r}; known: {', '.join(RULES)}")
    if stages.fixed:
        return parallel_batches_fastest(stages=stages, batch_size=batch_size,
                                        tolerance=tolerance)
    within = parallel_batches_within(stages=stages, batch_size=batch_size, tolerance=tolerance)
    return _same_minibatch(max(n, within), batch_size)


# --------------------------------------------------------------------------- one device


def server_slowdown(*, clients: int, parallelism: int = 1) -> float:
    """sigma: how much slower each of ``clients`` server-side replicas runs than one alone on a
    server with ``parallelism`` equal lanes (Figure 3(c), all replicas busy at once)."""
    if clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    if parallelism < 1:
        raise ValueError(f"server parallelism must be at least 1, got {parallelism}")
    return max(1.0, clients / parallelism)


def stage_times(*, cm: CostModel, device: str, server: str, split: int, batch_size: int,
                slowdown: float = 1.0) -> StageTimes:
    """Equations 5-10 for ``device`` with layers ``[0, split)`` and the rest on ``server``."""
    _check_batch(batch_size)
    if not 1 <= split < cm.num_layers:
        raise ValueError(f"split must be in 1..{cm.num_layers - 1} (layers [0, split) on the "
                         f"device), got {split}")
    if not math.isfinite(slowdown) or slowdown < 1:
        raise ValueError(f"slowdown must be a number >= 1, got {slowdown!r}")
    d, s = cm.index(device), cm.index(server)
    dev = cm.devices.device(device)
    r = batch_size / cm.profile.batch_size
    size = r * float(cm.output_bytes[split - 1])
    # a pass's own cost per micro-batch (overhead and messages), the server's slowed too
    device_f, device_b = cm.fixed_pass_s(d, 0, split - 1)
    server_f, server_b = cm.fixed_pass_s(s, split, cm.num_layers - 1)
    return StageTimes(
        pass_s=(device_f, 0.0, slowdown * server_f, slowdown * server_b, 0.0, device_b),
        device_forward_s=r * float(cm.fwd_prefix[d, split]),
        upload_s=size / dev.up_bps,
        server_forward_s=r * slowdown * float(cm.fwd_prefix[s, -1] - cm.fwd_prefix[s, split]),
        server_backward_s=r * slowdown * float(cm.bwd_prefix[s, -1] - cm.bwd_prefix[s, split]),
        download_s=size / dev.down_bps,
        device_backward_s=r * float(cm.bwd_prefix[d, split]),
        latency_s=float(cm.latency_s[d, s]),
    )


@dataclass(frozen=True)
class SplitChoice:
    """A (P, N) pair for one device and its predicted iteration time."""

    split: int
    parallel_batches: int
    iteration_s: float
    stages: StageTimes


def _candidates(*, cm: CostModel, device: str, server: str, batch_size: int,
                slowdown: float) -> Mapping[int, StageTimes]:
    return {p: stage_times(cm=cm, device=device, server=server, split=p, batch_size=batch_size,
                           slowdown=slowdown) for p in range(1, cm.num_layers)}


def _best(choices: Sequence[SplitChoice]) -> SplitChoice:
    """Fastest; among equally fast (1e-12 relative), fewest micro-batches, then smallest P."""
    if not choices:
        raise ValueError("the model needs at least two layers to be split between a device "
                         "and the server")
    fastest = min(c.iteration_s for c in choices)
    near = [c for c in choices if c.iteration_s <= fastest * (1 + 1e-12)]
    return min(near, key=lambda c: (c.parallel_batches, c.split))


def choose_split(*, cm: CostModel, device: str, server: str, batch_size: int,
                 slowdown: float = 1.0, rule: Rule = "saturated",
                 tolerance: float = DEFAULT_TOLERANCE) -> SplitChoice:
    """PipeLearn's choice: N by ``rule`` for every P, then the (P, N) of least iteration time."""
    choices = []
    for p, st in _candidates(cm=cm, device=device, server=server, batch_size=batch_size,
                             slowdown=slowdown).items():
        n = parallel_batches(stages=st, batch_size=batch_size, rule=rule, tolerance=tolerance)
        choices.append(SplitChoice(p, n, iteration_time(stages=st, parallel_batches=n), st))
    return _best(choices)


def exhaustive_split(*, cm: CostModel, device: str, server: str, batch_size: int,
                     slowdown: float = 1.0, max_parallel_batches: int | None = None
                     ) -> SplitChoice:
    """The best (P, N) over every P in 1..L-1 and N in 1..B (or 1..``max_parallel_batches``)
    by :func:`iteration_time`; ``max_parallel_batches=1`` is split learning without
    reordering."""
    top = batch_size if max_parallel_batches is None else min(max_parallel_batches, batch_size)
    if top < 1:
        raise ValueError(f"max_parallel_batches must be at least 1, got {max_parallel_batches}")
    choices = []
    for p, st in _candidates(cm=cm, device=device, server=server, batch_size=batch_size,
                             slowdown=slowdown).items():
        choices.append(_best([SplitChoice(p, n, iteration_time(stages=st, parallel_batches=n), st)
                              for n in range(1, top + 1)]))
    return _best(choices)
