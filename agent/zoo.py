"""The model zoo: each model is a list of cuttable layers (the units a plan's stages are made
of), written in plain torch.nn so it runs on any device with torch alone.

- ``mlp``: three hidden layers (256, 256, 128) and a classifier.
- ``vgg5``: VGG5 as PipeLearn defines it (data/pipelearn/model_layers.json): three 3x3
  conv-BN-ReLU layers (the first two max-pooled), two dense layers. 5 layers.
- ``resnet18``: ResNet18 as PipeLearn defines it: a 7x7/2 stem with max-pooling, eight basic
  blocks, a dense classifier; 10 layers. On inputs smaller than 32x32 the stem is a 3x3/1 conv
  without pooling (an 8x8 image would otherwise vanish).
- ``mobilenetv2``: MobileNetV2 for CIFAR (FTPipeHD's model): a 3x3 stem, 17 inverted residual
  blocks, a 1x1 conv to 1280 channels, a classifier; 20 layers.
- ``alexnet``: a small AlexNet for CIFAR (Duan-Wu's and TAPP's): five conv layers, three dense.

Input shapes: CIFAR-like (3, 32, 32) and 8x8 (1, 8, 8, scikit-learn's digits), or whatever an
.npz data set has; the spatial sizes are worked out from the input shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

MODELS = ("mlp", "vgg5", "resnet18", "mobilenetv2", "alexnet")


@dataclass(frozen=True)
class ZooLayer:
    name: str
    kind: str
    module: nn.Module


@dataclass(frozen=True)
class ZooModel:
    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    layers: tuple[ZooLayer, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def stage(self, first: int, last: int) -> nn.Sequential:
        """The layers first..last (inclusive) as one module."""
        if not 0 <= first <= last < self.num_layers:
            raise ValueError(f"layers {first}..{last} are not within 0..{self.num_layers - 1} "
                             f"of {self.name}")
        return nn.Sequential(*(layer.module for layer in self.layers[first:last + 1]))

    def full(self) -> nn.Sequential:
        return self.stage(0, self.num_layers - 1)


def _conv_bn_relu(cin: int, cout: int, *, pool: bool, kernel: int = 3, stride: int = 1,
                  bias: bool = True) -> nn.Sequential:
    parts: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=bias),
        nn.BatchNorm2d(cout), nn.ReLU(inplace=False)]
    if pool:
        parts.append(nn.MaxPool2d(2, 2))
    return nn.Sequential(*parts)


def _dense(cin: int, cout: int, *, relu: bool, flatten: bool = False) -> nn.Sequential:
    parts: list[nn.Module] = [nn.Flatten()] if flatten else []
    parts.append(nn.Linear(cin, cout))
    if relu:
        parts.append(nn.ReLU(inplace=False))
    return nn.Sequential(*parts)


def _channels_hw(shape: Sequence[int]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ValueError(f"this model needs images (channels, height, width), got input shape "
                         f"{tuple(shape)}")
    c, h, w = shape
    return c, h, w


def mlp(shape: Sequence[int], classes: int) -> list[ZooLayer]:
    features = 1
    for s in shape:
        features *= s
    return [ZooLayer("fc1", "dense", _dense(features, 256, relu=True, flatten=True)),
            ZooLayer("fc2", "dense", _dense(256, 256, relu=True)),
            ZooLayer("fc3", "dense", _dense(256, 128, relu=True)),
            ZooLayer("classifier", "dense", _dense(128, classes, relu=False))]


def vgg5(shape: Sequence[int], classes: int) -> list[ZooLayer]:
    c, h, w = _channels_hw(shape)
    return [ZooLayer("conv1", "conv", _conv_bn_relu(c, 32, pool=True)),
            ZooLayer("conv2", "conv", _conv_bn_relu(32, 64, pool=True)),
            ZooLayer("conv3", "conv", _conv_bn_relu(64, 64, pool=False)),
            ZooLayer("fc1", "dense", _dense(64 * (h // 4) * (w // 4), 128, relu=True,
                                            flatten=True)),
            ZooLayer("fc2", "dense", _dense(128, classes, relu=False))]


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convs and a shortcut (1x1 conv when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, *, pool: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=False),
            nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))
        self.pool: nn.Module = nn.AdaptiveAvgPool2d(1) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.pool(torch.relu(self.body(x) + self.shortcut(x)))
        return out


def resnet18(shape: Sequence[int], classes: int) -> list[ZooLayer]:
    c, h, _ = _channels_hw(shape)
    if h >= 32:
        stem = nn.Sequential(nn.Conv2d(c, 64, 7, stride=2, padding=3, bias=False),
                             nn.BatchNorm2d(64), nn.ReLU(inplace=False),
                             nn.MaxPool2d(3, stride=2, padding=1))
    else:
        stem = _conv_bn_relu(c, 64, pool=False, bias=False)
    plan = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2),
            (256, 256, 1), (256, 512, 2), (512, 512, 1)]
    layers = [ZooLayer("stem", "conv", stem)]
    for i, (cin, cout, stride) in enumerate(plan):
        layers.append(ZooLayer(f"block{i + 1}", "residual",
                               BasicBlock(cin, cout, stride, pool=i == len(plan) - 1)))
    layers.append(ZooLayer("classifier", "dense", _dense(512, classes, relu=False, flatten=True)))
    return layers


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        parts: list[nn.Module] = []
        if expand != 1:
            parts += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                      nn.ReLU6(inplace=False)]
        parts += [nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden,
                            bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=False),
                  nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*parts)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return x + out if self.residual else out


def mobilenetv2(shape: Sequence[int], classes: int) -> list[ZooLayer]:
    c, _, _ = _channels_hw(shape)
    # (expansion, channels, repeats, first stride), the CIFAR variant (stride 1 in stage 2)
    config = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
              (6, 160, 3, 2), (6, 320, 1, 1)]
    layers = [ZooLayer("stem", "conv", nn.Sequential(
        nn.Conv2d(c, 32, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(32),
        nn.ReLU6(inplace=False)))]
    cin = 32
    for expand, cout, repeats, stride in config:
        for r in range(repeats):
            layers.append(ZooLayer(f"block{len(layers)}", "inverted_residual",
                                   InvertedResidual(cin, cout, stride if r == 0 else 1, expand)))
            cin = cout
    layers.append(ZooLayer("head", "conv", nn.Sequential(
        nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(inplace=False),
        nn.AdaptiveAvgPool2d(1))))
    layers.append(ZooLayer("classifier", "dense", _dense(1280, classes, relu=False,
                                                         flatten=True)))
    return layers


def alexnet(shape: Sequence[int], classes: int) -> list[ZooLayer]:
    c, h, w = _channels_hw(shape)

    def conv(cin: int, cout: int, pool: bool) -> nn.Sequential:
        parts: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=False)]
        if pool:
            parts.append(nn.MaxPool2d(2, 2))
        return nn.Sequential(*parts)

    side_h, side_w = max(h // 8, 1), max(w // 8, 1)
    return [ZooLayer("conv1", "conv", conv(c, 64, True)),
            ZooLayer("conv2", "conv", conv(64, 192, True)),
            ZooLayer("conv3", "conv", conv(192, 384, False)),
            ZooLayer("conv4", "conv", conv(384, 256, False)),
            ZooLayer("conv5", "conv", nn.Sequential(
                nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=False),
                nn.AdaptiveMaxPool2d((side_h, side_w)))),
            ZooLayer("fc1", "dense", _dense(256 * side_h * side_w, 1024, relu=True,
                                            flatten=True)),
            ZooLayer("fc2", "dense", _dense(1024, 1024, relu=True)),
            ZooLayer("classifier", "dense", _dense(1024, classes, relu=False))]


_BUILDERS: dict[str, Callable[[Sequence[int], int], list[ZooLayer]]] = {
    "mlp": mlp, "vgg5": vgg5, "resnet18": resnet18, "mobilenetv2": mobilenetv2,
    "alexnet": alexnet,
}


def build_model(name: str, *, input_shape: Sequence[int], num_classes: int,
                seed: int = 0) -> ZooModel:
    """A freshly initialised model; the same seed gives the same weights on every device, so a
    stage built on one device matches the layers another device profiled."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    torch.manual_seed(seed)
    layers = _BUILDERS[name](tuple(input_shape), num_classes)
    return ZooModel(name=name, input_shape=tuple(input_shape), num_classes=num_classes,
                    layers=tuple(layers))
