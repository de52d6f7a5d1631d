"""Training data for the first stage (inputs) and the last (labels). Nothing is downloaded.

- ``digits``: scikit-learn's handwritten digits (1797 real 8x8 images, 10 classes), scaled to
  [0, 1]; the last 20% (fixed order) are held out.
- ``synthetic-cifar``: CIFAR-shaped images (3x32x32, 10 classes) generated from a seed: each
  class is a random smooth template, each image that template plus noise, so a model can learn
  it and the loss falls like on real data; a fifth of the labels (held-out ones too) are drawn
  at random, so that, as on real data, accuracy levels off below 100% (at most about 82%) and
  the loss above zero. Without them a model learnt it perfectly, and the demo's loss and
  accuracy charts showed nothing.
- ``npz:PATH``: a file with arrays ``x`` (N, C, H, W), (N, H, W) or (N, D) and integer labels
  ``y`` (N,); loaded with ``allow_pickle=False``. The server names the data set, so an agent
  reads such files only from the one directory its ``--data-dir`` names (``data_dir`` below):
  a relative PATH is taken inside it, and a path that resolves outside it (``..``, an absolute
  path elsewhere, a symbolic link out) is refused with the same message as a file that does
  not exist. Without a data directory ``npz:`` data sets are refused.

Micro-batch m is a deterministic function of (seed, m): each epoch is a fresh permutation of the
training set, so every device that reads the data agrees on what micro-batch m holds (a split-
learning client's two stages read its labels each from its own copy). A run may cut the
training set in shards (:meth:`Dataset.shard`), one per pipeline: a client's own data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

DATASETS = ("digits", "synthetic-cifar")
LABEL_NOISE = 0.2  # synthetic-cifar's labels drawn at random


class DataError(ValueError):
    """A data set that cannot be used, with the file and the problem."""


@dataclass(frozen=True, eq=False)
class Dataset:
    name: str
    x_train: npt.NDArray[np.float32]
    y_train: npt.NDArray[np.int64]
    x_test: npt.NDArray[np.float32]
    y_test: npt.NDArray[np.int64]
    num_classes: int
    _orders: dict[tuple[int, int], npt.NDArray[np.int64]] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])

    def indices(self, microbatch: int, batch_size: int, *, seed: int) -> npt.NDArray[np.int64]:
        """Training-set indices of micro-batch ``microbatch`` (a permutation per epoch)."""
        n = len(self.y_train)
        if batch_size > n:
            raise DataError(f"{self.name}: batch size {batch_size} exceeds the {n} training "
                            "samples")
        per_epoch = n // batch_size
        epoch, slot = divmod(microbatch, per_epoch)
        return self._order(seed, epoch)[slot * batch_size:(slot + 1) * batch_size]

    def _order(self, seed: int, epoch: int) -> npt.NDArray[np.int64]:
        """The epoch's permutation of the training set (the last one asked for is kept)."""
        key = (seed, epoch)
        cached = self._orders.get(key)
        if cached is None:
            cached = np.random.default_rng([seed, epoch]).permutation(
                len(self.y_train)).astype(np.int64)
            self._orders.clear()
            self._orders[key] = cached
        return cached

    def microbatch(self, microbatch: int, batch_size: int, *, seed: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(microbatch, batch_size, seed=seed)
        return torch.from_numpy(self.x_train[idx]), torch.from_numpy(self.y_train[idx])

    def labels(self, microbatch: int, batch_size: int, *, seed: int) -> torch.Tensor:
        """Micro-batch ``microbatch``'s labels alone (those of :meth:`microbatch`)."""
        return torch.from_numpy(self.y_train[self.indices(microbatch, batch_size, seed=seed)])

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.x_test), torch.from_numpy(self.y_test)

    def shard(self, index: int, count: int, *, split: str = "iid", seed: int = 0) -> Dataset:
        """Shard ``index`` of ``count`` of the training set (a split-learning client's own
        data; the held-out set stays whole, for the aggregated model's accuracy). "iid": a
        seeded permutation cut in ``count`` parts; "label-skew": the training set ordered by
        label (ties in a seeded order) cut in ``count`` parts, so that each holds only a
        few classes. The shards of one (count, split, seed) are disjoint and cover the set."""
        if not 0 <= index < count:
            raise DataError(f"{self.name}: shard {index} of {count} does not exist")
        if count > len(self.y_train):
            raise DataError(f"{self.name}: {count} shards of {len(self.y_train)} training "
                            "samples leave some empty")
        order = np.random.default_rng([seed, count]).permutation(len(self.y_train))
        if split == "label-skew":
            order = order[np.argsort(self.y_train[order], kind="stable")]
        elif split != "iid":
            raise DataError(f"unknown shard split {split!r}; use iid or label-skew")
        part = np.sort(np.array_split(order, count)[index])
        return Dataset(name=f"{self.name}[{split} {index}/{count}]",
                       x_train=np.ascontiguousarray(self.x_train[part]),
                       y_train=self.y_train[part], x_test=self.x_test, y_test=self.y_test,
                       num_classes=self.num_classes)


def _split(name: str, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64],
           classes: int) -> Dataset:
    cut = int(len(y) * 0.8)
    return Dataset(name=name, x_train=np.ascontiguousarray(x[:cut]), y_train=y[:cut],
                   x_test=np.ascontiguousarray(x[cut:]), y_test=y[cut:], num_classes=classes)


def digits() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return _split("digits", x, np.asarray(bunch.target, dtype=np.int64), 10)


def synthetic_cifar(*, samples: int = 6000, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    coarse = rng.normal(0.0, 1.0, size=(10, 3, 8, 8)).astype(np.float32)
    templates = coarse.repeat(4, axis=2).repeat(4, axis=3)  # smooth 32x32 patterns
    y = rng.integers(0, 10, size=samples).astype(np.int64)
    x = templates[y] + rng.normal(0.0, 4.0, size=(samples, 3, 32, 32)).astype(np.float32)
    noisy = rng.random(samples) < LABEL_NOISE  # labels drawn at random: no model gets them
    y[noisy] = rng.integers(0, 10, size=int(noisy.sum()))
    return _split("synthetic-cifar", x.astype(np.float32), y, 10)


def from_npz(path: str | Path) -> Dataset:
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as arrays:
            if "x" not in arrays or "y" not in arrays:
                raise DataError(f"{p}: needs arrays 'x' and 'y', has {sorted(arrays.files)}")
            x, y = arrays["x"], arrays["y"]
    except FileNotFoundError:
        raise DataError(f"{p}: no such file") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{p}: not a readable .npz file ({exc})") from None
    if x.ndim not in (2, 3, 4) or len(x) != len(y) or y.ndim != 1:
        raise DataError(f"{p}: x must be (N, D), (N, H, W) or (N, C, H, W) and y (N,) with the "
                        f"same N; got x {x.shape} and y {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or len(y) < 10:
        raise DataError(f"{p}: y must hold at least 10 integer class labels, got {y.dtype} "
                        f"x {len(y)}")
    if y.min() < 0:
        raise DataError(f"{p}: labels must not be negative, found {int(y.min())}")
    if x.ndim == 3:
        x = x[:, None]
    xf = x.astype(np.float32)
    if not np.isfinite(xf).all():
        raise DataError(f"{p}: x holds NaN or infinite values")
    return _split(f"npz:{p}", xf, y.astype(np.int64), int(y.max()) + 1)


def npz_path(path: str, *, data_dir: str | Path | None) -> Path:
    """The file ``npz:path`` names, inside ``data_dir`` (a relative path is taken from there):
    DataError when there is no data directory, or when the path resolves (symbolic links
    followed) to anything but a file inside it; the same message whether or not such a file
    exists elsewhere, so that the answer tells nothing of the machine's other files."""
    if data_dir is None:
        raise DataError(f"npz:{path}: this agent reads no npz data sets; pass --data-dir DIR "
                        "(or set EDGEPIPE_DATA_DIR=DIR) naming the one directory they may come "
                        "from")
    root = Path(data_dir).resolve()
    refused = DataError(f"npz:{path}: no such file in this agent's data directory (--data-dir); "
                        "npz paths are read from there only")
    if not path or "\0" in path:
        raise refused
    try:
        resolved = (root / path).resolve()
    except (OSError, RuntimeError, ValueError):  # a symbolic-link loop, a bad name
        raise refused from None
    if not resolved.is_relative_to(root) or not resolved.is_file():
        raise refused
    return resolved


def load_dataset(spec: str, *, seed: int = 0, data_dir: str | Path | None = None) -> Dataset:
    """``digits``, ``synthetic-cifar`` or ``npz:PATH`` (a file in ``data_dir``: npz_path)."""
    if spec == "digits":
        return digits()
    if spec == "synthetic-cifar":
        return synthetic_cifar(seed=seed)
    if spec.startswith("npz:"):
        return from_npz(npz_path(spec[4:], data_dir=data_dir))
    raise DataError(f"unknown data set {spec!r}; use digits, synthetic-cifar or npz:PATH")
