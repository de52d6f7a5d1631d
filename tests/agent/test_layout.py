"""agent.layout: the memory format a stage's convolutions run in, chosen by timing both."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent import layout
from agent.layout import faster_format, has_conv2d, stage_example, to_format
from agent.zoo import build_model


def vgg(seed: int = 0) -> nn.Sequential:
    return build_model("vgg5", input_shape=(1, 8, 8), num_classes=10, seed=seed).full()


def channels_last(module: nn.Module) -> bool:
    weights = [p for p in module.parameters() if p.dim() == 4]
    # a weight of one input channel is laid out alike in both
    return (all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
            and not all(w.is_contiguous() for w in weights))


def test_only_a_module_with_a_2d_convolution_is_timed() -> None:
    mlp = build_model("mlp", input_shape=(1, 8, 8), num_classes=10).full()
    assert not has_conv2d(mlp)
    assert has_conv2d(vgg())
    assert faster_format(mlp, torch.zeros(4, 1, 8, 8)) == "contiguous"


def test_to_format_lays_out_the_4d_parameters_and_refuses_an_unknown_name() -> None:
    module = to_format(vgg(), "channels_last")
    assert channels_last(module)
    assert to_format(module, "contiguous") is module
    assert all(p.is_contiguous() for p in module.parameters())
    with pytest.raises(ValueError, match="unknown memory format 'nhwc'"):
        to_format(module, "nhwc")


def test_a_first_convolution_of_one_input_channel_runs_in_the_format_too() -> None:
    # its weight is contiguous in both formats, and .contiguous(memory_format=...) left it
    # with NCHW's strides: torch then ran the whole first block NCHW (bug: a quarter of
    # VGG-5's first stage on the digits went to that block and to converting its output)
    module = to_format(vgg(), "channels_last")
    first = module[0][0]
    assert first.weight.shape[1] == 1 and first.weight.stride() == (9, 1, 3, 1)
    out = first(torch.randn(4, 1, 8, 8))
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    back = to_format(module, "contiguous")[0][0]
    assert back.weight.stride() == (9, 9, 3, 1)
    assert back(torch.randn(4, 1, 8, 8)).is_contiguous()


def test_timing_leaves_the_module_as_it_was() -> None:
    module = vgg()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    faster_format(module, torch.randn(8, 1, 8, 8))
    after = module.state_dict()
    # its batch norms' running statistics and its parameters, values and layout
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.is_contiguous() for p in module.parameters())


@pytest.mark.parametrize(("cost", "expected"), [
    ({"contiguous": 1.0, "channels_last": 0.5}, "channels_last"),
    ({"contiguous": 1.0, "channels_last": 0.97}, "contiguous"),  # within the margin: a tie
    ({"contiguous": 0.5, "channels_last": 1.0}, "contiguous"),
])
def test_the_faster_layout_is_taken_only_beyond_the_margin(
        monkeypatch: pytest.MonkeyPatch, cost: dict[str, float], expected: str) -> None:
    timed: list[str] = []

    def fake_pass_s(module: nn.Module, params: object, example: torch.Tensor) -> float:
        name = "channels_last" if channels_last(module) else "contiguous"
        timed.append(name)
        return cost[name]

    monkeypatch.setattr(layout, "_pass_s", fake_pass_s)
    assert faster_format(vgg(), torch.zeros(4, 1, 8, 8)) == expected
    # each layout warmed once, then timed alternately, at least MIN_ROUNDS times each
    assert timed.count("channels_last") == timed.count("contiguous") > layout.MIN_ROUNDS


def test_a_stage_example_has_its_first_layers_input_shape() -> None:
    model = build_model("vgg5", input_shape=(1, 8, 8), num_classes=10)
    layers = [layer.module for layer in model.layers]
    before = {k: v.clone() for k, v in model.full().state_dict().items()}
    assert stage_example(layers, (1, 8, 8), 32, 0).shape == (32, 1, 8, 8)
    assert stage_example(layers, (1, 8, 8), 32, 2).shape == (32, 64, 2, 2)
    assert stage_example(layers, (1, 8, 8), 32, 4).shape == (32, 128)
    # copies in eval mode: the model's own batch norms are untouched
    assert all(torch.equal(before[k], v) for k, v in model.full().state_dict().items())


def test_a_convolution_with_channels_last_weights_computes_the_same_function() -> None:
    x = torch.randn(16, 1, 8, 8)
    nchw, last = vgg(seed=3), to_format(vgg(seed=3), "channels_last")
    assert torch.allclose(nchw(x), last(x), atol=1e-5)
