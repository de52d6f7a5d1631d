"""Generate the VGG5 and ResNet18 (CIFAR-10) profiles PipeLearn is evaluated on, as estimates.

There are no measured per-layer times for these two models in the repository, so this script
derives them, deterministically, from what is there:

1. Per-layer forward FLOPs per sample from the layer structure PipeLearn defines
   (``data/pipelearn/model_layers.json``): a k x k convolution from Cin to Cout channels with an
   H x W output costs ``2 Cin k^2 Cout H W`` (plus ``Cout H W`` for a bias), a dense layer
   ``2 in out + out``, batch normalisation 4 FLOPs per element (training mode: mean, variance,
   normalise, scale and shift), ReLU and the residual add 1, max/avg pooling one per input
   element of each window. The parameter count implied by each layer's reading is checked
   against the file's ``params`` so that a misread architecture fails here.
2. Backward = 2 x forward FLOPs (the gradient with respect to the input and to the weights each
   cost about one forward).
3. One FLOP rate for the reference device (``edge-vm``, speed 1.0), calibrated on the measured
   ResNet-101 testbed profile (``data/profiles/resnet101_cifar10.model.json``): its layers 10-31
   are the 22 identical conv4_x bottleneck blocks (1024 -> 256 -> 256 -> 1024 channels at 2 x 2,
   as their output sizes say), whose FLOPs are known exactly by rule 1. The rate is their
   forward + backward FLOPs (3 x forward, rule 2) divided by their measured forward + backward
   time, so the total training time of those blocks is reproduced and the split between forward
   and backward follows rule 2.
4. Each testbed device (``data/profiles/resnet101_cifar10.devices.json``) gets ``layer_times`` =
   reference time / its measured ``speed`` (the testbed's ratio of its total ResNet-101 time to
   the reference's). Links are PipeLearn's default experiment (``data/pipelearn/
   experiment_config.json``): 10 Mbit/s up and 25 Mbit/s down between each client and the
   server; memory, latency and labels are the testbed file's.

Sizes: ``output_bytes`` = fp32 output of the layer for one batch, ``param_bytes`` = 4 x params,
``activation_bytes`` = fp32 bytes of every tensor the layer produces inside it (convolution or
dense output, BN, ReLU, pooling, the residual add, the shortcut branch) for one batch.

These are estimates, not measurements. Run from anywhere; rewrites the four files:

    .venv/bin/python bench/make_pipelearn_profiles.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is not installed
    sys.path.insert(0, str(ROOT))

from orchestrator.formats import parse_devices, parse_profile  # noqa: E402

DATA = ROOT / "data"
LAYERS_FILE = DATA / "pipelearn" / "model_layers.json"
CONFIG_FILE = DATA / "pipelearn" / "experiment_config.json"
TESTBED_PROFILE = DATA / "profiles" / "resnet101_cifar10.model.json"
TESTBED_DEVICES = DATA / "profiles" / "resnet101_cifar10.devices.json"
MODELS = {"vgg5": "VGG5/CIFAR-10", "resnet18": "ResNet18/CIFAR-10"}
REFERENCE = "edge-vm"
CALIBRATION_LAYERS = range(10, 32)  # ResNet-101 conv4_x identity bottlenecks (22 blocks)
BYTES_PER_FLOAT = 4
BN_FLOPS = 4  # per element, training mode
MBIT = 1e6 / 8  # bytes per second in one Mbit/s


@dataclass(frozen=True)
class LayerCost:
    """Per-sample forward FLOPs, parameters and kept activation elements of one layer."""

    flops: float
    params: int
    activation_elems: int


def _elems(shape: list[int]) -> int:
    out = 1
    for x in shape:
        out *= x
    return out


def _conv(cin: int, cout: int, k: int, hw: int, *, bias: bool) -> tuple[float, int]:
    """FLOPs and parameters of a k x k convolution with an output of hw positions."""
    flops = 2.0 * cin * k * k * cout * hw + (cout * hw if bias else 0)
    return flops, cin * k * k * cout + (cout if bias else 0)


def _conv_block(entry: dict[str, Any], *, k: int, bias: bool, pool_window: int) -> LayerCost:
    """Convolution, BN, ReLU and an optional max pooling (window ``pool_window``, 0 = none)."""
    leaf = entry["first_leaf_output_shape_per_sample"]
    conv_out = _elems(leaf)
    flops, params = _conv(entry["in_ch"], entry["out_ch"], k, leaf[1] * leaf[2], bias=bias)
    flops += (BN_FLOPS + 1) * conv_out
    params += 2 * entry["out_ch"]
    kept = 3 * conv_out
    if pool_window:
        out = entry["output_elems_per_sample"]
        flops += pool_window * pool_window * out
        kept += out
    return LayerCost(flops, params, kept)


def _basic_block(entry: dict[str, Any]) -> LayerCost:
    """ResNet basic block: 3x3 conv (stride s), BN, ReLU, 3x3 conv, BN, shortcut (1x1 conv + BN
    when the shape changes), add, ReLU; PipeLearn's last block also average-pools a 1 x 1 map."""
    cin, cout = entry["in_ch"], entry["out_ch"]
    shape = entry["output_shape_per_sample"]
    hw, out = shape[1] * shape[2], _elems(shape)
    f1, p1 = _conv(cin, cout, 3, hw, bias=False)
    f2, p2 = _conv(cout, cout, 3, hw, bias=False)
    flops, params, tensors = f1 + f2 + 2 * BN_FLOPS * out + 3 * out, p1 + p2 + 4 * cout, 7
    if entry.get("stride", 1) != 1 or cin != cout:
        f3, p3 = _conv(cin, cout, 1, hw, bias=False)
        flops, params, tensors = flops + f3 + BN_FLOPS * out, params + p3 + 2 * cout, tensors + 2
    if "avgpool" in entry["type"]:
        flops, tensors = flops + out, tensors + 1
    return LayerCost(flops, params, tensors * out)


def _dense(entry: dict[str, Any]) -> LayerCost:
    cin, cout = entry["in_ch"], entry["out_ch"]
    return LayerCost(2.0 * cin * cout + cout, cin * cout + cout, cout)


LAYER_KINDS: dict[str, tuple[str, Callable[[dict[str, Any]], LayerCost]]] = {
    "Convolutional(conv3x3,BN,ReLU,maxpool2/2)":
        ("conv", lambda e: _conv_block(e, k=3, bias=True, pool_window=2)),
    "Convolutional(conv3x3,BN,ReLU)":
        ("conv", lambda e: _conv_block(e, k=3, bias=True, pool_window=0)),
    "Convolutional(conv7x7/2 no-bias,BN,ReLU,maxpool3/2 pad1)":
        ("conv", lambda e: _conv_block(e, k=7, bias=False, pool_window=3)),
    "ResBasicBlock": ("block", _basic_block),
    "ResBasicBlock (+avgpool(1,1))": ("block", _basic_block),
    "Dense": ("dense", _dense),
}


def layer_cost(entry: dict[str, Any]) -> tuple[str, LayerCost]:
    """The kind and cost of one model_layers.json entry; raises if its reading does not give
    the parameter count the file states."""
    if entry["type"] not in LAYER_KINDS:
        raise ValueError(f"unknown layer type {entry['type']!r}")
    kind, cost_of = LAYER_KINDS[entry["type"]]
    cost = cost_of(entry)
    if cost.params != entry["params"]:
        raise ValueError(f"layer {entry['layer_idx']} ({entry['type']}): the architecture gives "
                         f"{cost.params} parameters, the file says {entry['params']}")
    return kind, cost


def calibration_flops_per_sample() -> float:
    """Forward FLOPs of one ResNet-101 conv4_x identity bottleneck on a 2 x 2 map."""
    hw, width, out_ch = 4, 256, 1024
    convs = (_conv(out_ch, width, 1, hw, bias=False)[0] + _conv(width, width, 3, hw, bias=False)[0]
             + _conv(width, out_ch, 1, hw, bias=False)[0])
    elems = (width + width + out_ch) * hw  # BN and ReLU after each convolution
    return convs + (BN_FLOPS + 1) * elems + out_ch * hw  # + the residual add


def reference_flop_rate(testbed: dict[str, Any]) -> float:
    """FLOP/s of the reference device from the measured ResNet-101 bottleneck blocks."""
    batch = testbed["batch_size"]
    layers = [testbed["layers"][i] for i in CALIBRATION_LAYERS]
    for layer in layers:  # the blocks are what we take them to be: 1024 x 2 x 2 fp32 outputs
        per_sample = layer["output_bytes"] / batch
        if abs(per_sample - 1024 * 4 * BYTES_PER_FLOAT) > 100:
            raise ValueError(f"{layer['name']}: output of {per_sample} bytes per sample is not "
                             "a 1024 x 2 x 2 map")
    seconds = sum(la["forward_s"] + la["backward_s"] for la in layers)
    return 3.0 * calibration_flops_per_sample() * batch * len(layers) / seconds


def model_profile(name: str, entries: list[dict[str, Any]], *, batch: int,
                  rate: float) -> dict[str, Any]:
    layers = []
    for entry in entries:
        kind, cost = layer_cost(entry)
        forward_s = round(cost.flops * batch / rate, 9)
        layers.append({
            "name": f"layer{entry['layer_idx']}", "kind": kind,
            "forward_s": forward_s, "backward_s": 2.0 * forward_s,
            "output_bytes": entry["output_bytes_per_sample_fp32"] * batch,
            "param_bytes": cost.params * BYTES_PER_FLOAT,
            "activation_bytes": cost.activation_elems * BYTES_PER_FLOAT * batch,
        })
    return {"model": name, "dataset": "cifar10", "batch_size": batch, "reference": REFERENCE,
            "source": (f"ESTIMATE (not measured): FLOPs of PipeLearn's {MODELS[name]} layers / "
                       f"{rate / 1e9:.3f} GFLOP/s calibrated on the ResNet-101 testbed profile; "
                       "backward = 2 x forward; see data/README.md and "
                       "bench/make_pipelearn_profiles.py"),
            "layers": layers}


def device_set(profile: dict[str, Any], testbed_devices: dict[str, Any],
               config: dict[str, Any]) -> dict[str, Any]:
    up = config["uplink_bandwidth"] * MBIT
    down = config["downlink_bandwidth"] * MBIT
    devices = []
    for dev in testbed_devices["devices"]:
        out = {k: v for k, v in dev.items() if k != "layer_times"}
        if dev["id"] != REFERENCE:
            out["uplink_bps"], out["downlink_bps"] = up, down
        out["layer_times"] = {
            "forward_s": [round(la["forward_s"] / dev["speed"], 9) for la in profile["layers"]],
            "backward_s": [round(la["backward_s"] / dev["speed"], 9) for la in profile["layers"]],
        }
        devices.append(out)
    return {"devices": devices, "links": []}


def build() -> dict[Path, dict[str, Any]]:
    """Every generated document by its path (validated against the shared formats)."""
    structure = json.loads(LAYERS_FILE.read_text())["models"]
    config = json.loads(CONFIG_FILE.read_text())
    testbed = json.loads(TESTBED_PROFILE.read_text())
    testbed_devices = json.loads(TESTBED_DEVICES.read_text())
    rate = reference_flop_rate(testbed)
    out: dict[Path, dict[str, Any]] = {}
    for name, key in MODELS.items():
        profile = model_profile(name, structure[key], batch=config["batch_size"], rate=rate)
        devices = device_set(profile, testbed_devices, config)
        model_path = DATA / "profiles" / f"{name}_cifar10.model.json"
        devices_path = DATA / "profiles" / f"{name}_cifar10.devices.json"
        parse_profile(profile, file=str(model_path))
        parse_devices(devices, file=str(devices_path))
        out[model_path], out[devices_path] = profile, devices
    return out


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs from what would be written")
    args = parser.parse_args(argv)
    testbed = json.loads(TESTBED_PROFILE.read_text())
    print(f"reference FLOP rate: {reference_flop_rate(testbed) / 1e9:.3f} GFLOP/s",
          file=sys.stderr)
    stale = []
    for path, document in build().items():
        text = render(document)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    for path in stale:
        print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
