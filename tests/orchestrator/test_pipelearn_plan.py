"""Per-epoch figures of PipeLearn and its baselines (orchestrator.pipelearn_plan) against small
cases computed by hand, server contention, and the generated VGG5/ResNet18 profiles."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from bench import make_pipelearn_profiles as gen
from orchestrator.errors import PlanningError
from orchestrator.formats import load_devices, load_profile, parse_devices, parse_profile
from orchestrator.pipelearn_plan import compare, make_setting, plan_method, union_length_s
from tests.conftest import DATA

# Two layers on a reference device; the client is the reference (speed 1), the server 10x
# faster. B = 10 (the profile's), 20 samples: two iterations an epoch. Latency 0.1 s.
PROFILE = {"model": "tiny", "batch_size": 10, "reference": "ref", "layers": [
    {"name": "a", "kind": "conv", "forward_s": 1.0, "backward_s": 2.0, "output_bytes": 1000,
     "param_bytes": 400, "activation_bytes": 0},
    {"name": "b", "kind": "dense", "forward_s": 0.5, "backward_s": 1.0, "output_bytes": 40,
     "param_bytes": 800, "activation_bytes": 0}]}


def client(name: str) -> dict[str, Any]:
    return {"id": name, "speed": 1.0, "memory_bytes": 1, "bandwidth_bps": 1e6,
            "uplink_bps": 100.0, "downlink_bps": 200.0, "latency_s": 0.1}


def tiny(*clients: str, parallelism: int = 1) -> Any:
    devices = parse_devices({"devices": [
        {"id": "srv", "speed": 10.0, "memory_bytes": 1, "bandwidth_bps": 1e6},
        *(client(c) for c in clients)]}, file="tiny.devices.json")
    return make_setting(profile=parse_profile(PROFILE), devices=devices, server="srv",
                        data_size=20, server_parallelism=parallelism)


def test_fl_by_hand() -> None:
    fl = plan_method(tiny("c"), "fl")
    c = fl.devices[0]
    assert (c.split, c.parallel_batches, c.iteration_s) == (2, 1, 4.5)  # 1.5 fwd + 3 bwd
    # 2 iterations, then 1200 model bytes up at 100 B/s and down at 200 B/s, 0.1 s latency each
    assert fl.epoch_s == pytest.approx(9 + 12 + 0.1 + 6 + 0.1)
    figures = fl.figures[0]
    assert figures.device_idle_s == pytest.approx(27.2 - 9)
    assert fl.server_idle_s == pytest.approx(27.2)  # the server only averages (zero time)
    assert figures.network_bps == pytest.approx(2 * 1200 / 27.2)


def test_sfl_by_hand() -> None:
    sfl = plan_method(tiny("c"), "sfl")
    c = sfl.devices[0]
    # forward 1 + upload 1000/100 + 0.1 + server 0.15 + download 1000/200 + 0.1 + backward 2
    assert (c.split, c.parallel_batches) == (1, 1)
    assert c.iteration_s == pytest.approx(18.35)
    epoch = 2 * 18.35 + 400 / 100 + 0.1 + 400 / 200 + 0.1
    assert sfl.epoch_s == pytest.approx(epoch)
    assert sfl.server_idle_s == pytest.approx(epoch - 2 * 0.15)
    assert sfl.figures[0].replica_idle_s == pytest.approx(epoch - 2 * 0.15)
    assert sfl.figures[0].device_idle_s == pytest.approx(epoch - 2 * 3.0)
    assert sfl.figures[0].network_bps == pytest.approx((2 * 2 * 1000 + 2 * 400) / epoch)


def test_pipelearn_by_hand() -> None:
    result = compare(tiny("c"))
    c = result.pipelearn.devices[0]
    # network bound: T(N) = 0.2 + 10 + (1 + 0.15 + 5 + 2) / N, best at N = B = 10
    assert (c.split, c.parallel_batches) == (1, 10)
    assert c.iteration_s == pytest.approx(11.015)
    assert result.pipelearn.epoch_s == pytest.approx(2 * 11.015 + 4 + 2 + 0.2)
    assert result.speedup(result.sfl) == pytest.approx(result.sfl.epoch_s / (22.03 + 6.2))
    document = result.to_json()
    assert document["devices"]["c"]["minibatch"] == 1
    assert set(document) >= {"devices", "fl", "sfl", "speedup", "epoch_s", "server_idle_s"}


def test_contention_slows_every_replica_and_the_union_counts_overlap_once() -> None:
    alone = plan_method(tiny("c"), "sfl")
    shared = plan_method(tiny("c", "d"), "sfl")
    assert shared.setting.slowdown == 2.0
    assert shared.devices[0].stages.server_s == pytest.approx(2 * alone.devices[0].stages.server_s)
    # identical clients: their replicas run at the same moments, the server is busy as one
    assert shared.server_idle_s == pytest.approx(shared.figures[0].replica_idle_s)
    lanes = plan_method(tiny("c", "d", parallelism=2), "sfl")
    assert lanes.devices[0].stages.server_s == pytest.approx(alone.devices[0].stages.server_s)


@pytest.mark.parametrize(("intervals", "expected"), [
    ([], 0.0),
    ([(0, 1)], 1.0),
    ([(0, 2), (1, 3), (5, 6)], 4.0),
    ([(5, 6), (0, 10), (2, 3)], 10.0),
    ([(0, 1), (1, 2)], 2.0),
])
def test_union_length(intervals: list[tuple[float, float]], expected: float) -> None:
    starts = np.array([s for s, _ in intervals], dtype=float)
    ends = np.array([e for _, e in intervals], dtype=float)
    assert union_length_s(starts, ends) == pytest.approx(expected)


def test_setting_errors() -> None:
    devices = parse_devices({"devices": [client("only")]}, file="one.devices.json")
    with pytest.raises(PlanningError, match=re.escape("one.devices.json has no client")):
        make_setting(profile=parse_profile(PROFILE), devices=devices, server="only")
    with pytest.raises(ValueError,
                       match=re.escape("--server 'x' is not a device of one.devices.json")):
        make_setting(profile=parse_profile(PROFILE), devices=devices, server="x")
    single = dict(PROFILE, layers=PROFILE["layers"][:1])
    two = parse_devices({"devices": [client("a"), client("b")]})
    with pytest.raises(PlanningError, match="has one layer"):
        make_setting(profile=parse_profile(single), devices=two, server="a")
    with pytest.raises(ValueError, match="batch size must be a positive integer, got 0"):
        make_setting(profile=parse_profile(PROFILE), devices=two, server="a", batch_size=0)
    with pytest.raises(ValueError, match="unknown method 'gossip'"):
        plan_method(tiny("c"), "gossip")


@pytest.mark.parametrize("model", ["vgg5", "resnet18"])
def test_pipelearn_beats_both_baselines_on_the_generated_profiles(model: str) -> None:
    setting = make_setting(
        profile=load_profile(DATA / "profiles" / f"{model}_cifar10.model.json"),
        devices=load_devices(DATA / "profiles" / f"{model}_cifar10.devices.json"),
        server="edge-vm")
    result = compare(setting)
    assert setting.clients == ("m1-laptop", "rpi4", "jetson-cpu", "jetson-gpu")
    assert setting.batch_size == 100 and setting.iterations == 100
    assert result.speedup(result.fl) > 1.5 and result.speedup(result.sfl) > 1.0
    assert result.pipelearn.server_idle_s < result.fl.server_idle_s
    assert result.pipelearn.network_bps > result.fl.network_bps


def test_generated_profiles_are_reproducible_and_calibrated() -> None:
    documents = gen.build()
    assert len(documents) == 4
    for path, document in documents.items():
        assert path.read_text() == gen.render(document), f"{path} is stale: rerun the script"
    testbed = json.loads(gen.TESTBED_PROFILE.read_text())
    rate = gen.reference_flop_rate(testbed)
    blocks = [testbed["layers"][i] for i in gen.CALIBRATION_LAYERS]
    predicted = 3 * gen.calibration_flops_per_sample() * testbed["batch_size"] / rate
    measured = sum(la["forward_s"] + la["backward_s"] for la in blocks) / len(blocks)
    assert predicted == pytest.approx(measured)  # the calibration reproduces those blocks
    vgg = load_profile(DATA / "profiles" / "vgg5_cifar10.model.json")
    devices = load_devices(DATA / "profiles" / "vgg5_cifar10.devices.json")
    assert all(la.backward_s == pytest.approx(2 * la.forward_s) for la in vgg.layers)
    rpi = devices.device("rpi4")
    assert rpi.layer_times is not None and rpi.up_bps == 1.25e6 and rpi.down_bps == 3.125e6
    assert rpi.layer_times.forward_s[1] == pytest.approx(vgg.layers[1].forward_s / rpi.speed,
                                                         rel=1e-6)


def test_generator_rejects_a_misread_architecture() -> None:
    entry = {"type": "Dense", "in_ch": 128, "out_ch": 10, "params": 1000, "layer_idx": 4}
    with pytest.raises(ValueError, match="the architecture gives 1290 parameters"):
        gen.layer_cost(entry)


def test_a_users_split_and_n_replace_the_planners_for_that_device() -> None:
    setting = tiny("c", "d")
    plan = plan_method(setting, "pipelearn", overrides={"d": (1, 2)})
    assert (plan.device("d").split, plan.device("d").parallel_batches) == (1, 2)
    assert plan.device("c").parallel_batches == plan_method(setting, "pipelearn").device(
        "c").parallel_batches
    for overrides, match in (({"d": (2, 1)}, r"overrides\.d\.split: must be an integer "
                                             r"from 1 to 1"),
                             ({"d": (1, 11)}, r"overrides\.d\.parallel_batches"),
                             ({"e": (1, 1)}, r"overrides\.e: is not a client")):
        with pytest.raises(ValueError, match=match):
            plan_method(setting, "pipelearn", overrides=overrides)
