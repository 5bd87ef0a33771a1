"""Per-layer model profiles for the scale-out predictor (:mod:`workbench.netsim.predict`).

A profile is a list of :class:`LayerProfile` in forward order: each layer's parameter count (and
its parameter tensors, weight then bias, as the runtime's flat pool registers them) and its
forward and backward compute seconds per step at one per-rank batch. Build one from measurements
(:func:`profile_from_table`: a list of dicts, a DataFrame or a CSV file) or use the built-in
:func:`alexnet_profile`, which derives AlexNet's layers from torchvision's shapes (written here as
numbers: no torch) and their compute time from FLOPs and an assumed GPU rate.

Pure Python (pandas for CSV files): no torch, no MPI.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence


class ProfileError(ValueError):
    """A profile or table that cannot be used; the message names the column or parameter."""


@dataclass(frozen=True)
class LayerProfile:
    """One layer: ``parameters`` (elements), ``forward_s`` and ``backward_s`` (seconds per step at
    the profile's per-rank batch) and ``tensors``: its parameter tensors' sizes in registration
    order (weight, bias); ``()`` means one tensor of ``parameters`` elements (none if 0)."""

    name: str
    parameters: int
    forward_s: float
    backward_s: float
    tensors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.parameters, int) or isinstance(self.parameters, bool) or self.parameters < 0:
            raise ProfileError(f"layer {self.name!r}: parameters must be an integer >= 0; got {self.parameters!r}")
        for name in ("forward_s", "backward_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise ProfileError(f"layer {self.name!r}: {name} must be a number of seconds >= 0; got {value!r}")
        tensors = tuple(int(t) for t in self.tensors)
        if tensors and (sum(tensors) != self.parameters or min(tensors) < 1):
            raise ProfileError(f"layer {self.name!r}: tensors {list(tensors)} must be positive sizes adding up "
                               f"to parameters={self.parameters}")
        object.__setattr__(self, "tensors", tensors)

    @property
    def tensor_sizes(self) -> tuple[int, ...]:
        """The parameter tensors (elements), in registration order."""
        return self.tensors or ((self.parameters,) if self.parameters else ())


def check_profile(profile: Sequence[LayerProfile]) -> list[LayerProfile]:
    """``profile`` as a list, or :class:`ProfileError` if it is empty or holds something else."""
    layers = list(profile)
    if not layers or not all(isinstance(layer, LayerProfile) for layer in layers):
        raise ProfileError("profile must be a non-empty list of LayerProfile (forward order)")
    if sum(layer.parameters for layer in layers) == 0:
        raise ProfileError("profile has no parameters: nothing to communicate")
    return layers


def _tensors(value) -> tuple[int, ...]:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return ()
    if isinstance(value, str):
        return tuple(int(part) for part in value.replace(";", "+").split("+") if part.strip())
    if isinstance(value, (int, float)):
        return (int(value),)
    return tuple(int(v) for v in value)


def profile_from_table(table) -> list[LayerProfile]:
    """A profile from rows with the columns ``name, parameters, forward_s, backward_s`` and,
    optionally, ``tensors`` (``"23232+64"``: weight + bias): a list of dicts, a DataFrame, or the
    path of a CSV file with that header. Rows are layers in forward order."""
    if isinstance(table, (str, Path)):
        path = Path(table)
        if not path.exists():
            raise ProfileError(f"profile: no file at {path}")
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    elif hasattr(table, "to_dict"):
        rows = table.to_dict("records")
    else:
        rows = list(table)
    layers = []
    for i, row in enumerate(rows):
        missing = {"name", "parameters", "forward_s", "backward_s"} - set(row)
        if missing:
            raise ProfileError(f"profile: row {i} lacks the column(s) {sorted(missing)} "
                               "(need name, parameters, forward_s, backward_s; optional tensors)")
        try:
            layers.append(LayerProfile(str(row["name"]), int(float(row["parameters"])), float(row["forward_s"]),
                                       float(row["backward_s"]), _tensors(row.get("tensors"))))
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"profile: row {i} ({row.get('name')!r}): {exc}") from None
    return check_profile(layers)


def profile_table(profile: Iterable[LayerProfile]):
    """The profile as a DataFrame (one row per layer; the columns :func:`profile_from_table` reads)."""
    import pandas as pd
    return pd.DataFrame([{"name": l.name, "parameters": l.parameters, "forward_s": l.forward_s,
                          "backward_s": l.backward_s, "tensors": "+".join(map(str, l.tensor_sizes))}
                         for l in profile])


# -- AlexNet ------------------------------------------------------------------------------------

#: peak FLOP/s of GPUs the papers name or imply
GPU_PEAK_FLOPS = {
    "v100-tensor": 125e12,   # NVIDIA V100 (SXM2), fp16 tensor cores: mixed-precision training
    "v100": 15.7e12,         # NVIDIA V100 (SXM2), fp32
    "p40": 11.76e12,         # NVIDIA Tesla P40, fp32 (its fp16 rate is 1/64 of that)
}
#: default GPU rate of :func:`alexnet_profile`: a V100's tensor-core peak ...
DEFAULT_GPU_FLOPS = GPU_PEAK_FLOPS["v100-tensor"]
#: ... at 11% of it (13.75 TFLOP/s): one GPU then trains 3.3K images/s, the rate GradientFlow's
#: own numbers imply (95 epochs of 1.28M images in 1.5 min on 512 GPUs is 2.64K images/s per GPU
#: at 80.1% efficiency: 2.64K / 0.801 = 3.3K for one GPU)
DEFAULT_EFFICIENCY = 0.11
#: per-GPU batch: GradientFlow's AlexNet run, 64K images over 512 GPUs
DEFAULT_BATCH = 128

#: torchvision's AlexNet, forward order: ("conv", name, out channels, kernel, stride, padding),
#: ("pool", kernel, stride), ("adaptive", side) and ("fc", name, out features)
ALEXNET_LAYERS = (
    ("conv", "conv1", 64, 11, 4, 2), ("pool", 3, 2),
    ("conv", "conv2", 192, 5, 1, 2), ("pool", 3, 2),
    ("conv", "conv3", 384, 3, 1, 1),
    ("conv", "conv4", 256, 3, 1, 1),
    ("conv", "conv5", 256, 3, 1, 1), ("pool", 3, 2), ("adaptive", 6),
    ("fc", "fc6", 4096), ("fc", "fc7", 4096), ("fc", "fc8", None),   # None: the class count
)


def layer_flops(spec: Sequence = ALEXNET_LAYERS, image_size: int = 224, channels: int = 3,
                classes: int = 1000) -> list[tuple[str, tuple[int, int], float]]:
    """Per parametric layer of ``spec``: ``(name, (weight, bias) elements, forward FLOPs per image)``
    (2 per multiply-add, plus the bias adds); convolutions and pools change the side as
    ``(side + 2 pad - kernel) // stride + 1``."""
    side, depth, out = image_size, channels, []
    features = None
    for layer in spec:
        kind = layer[0]
        if kind == "conv":
            _, name, filters, kernel, stride, pad = layer
            side = (side + 2 * pad - kernel) // stride + 1
            weight, outputs = filters * depth * kernel * kernel, side * side * filters
            out.append((name, (weight, filters), 2.0 * outputs * depth * kernel * kernel + outputs))
            depth = filters
        elif kind == "pool":
            side = (side - layer[1]) // layer[2] + 1
        elif kind == "adaptive":
            side = layer[1]
        elif kind == "fc":
            _, name, width = layer
            width = classes if width is None else width
            features = side * side * depth if features is None else features
            out.append((name, (features * width, width), 2.0 * features * width + width))
            features = width
        else:
            raise ProfileError(f"layer_flops: unknown layer kind {kind!r}; allowed: conv, pool, adaptive, fc")
    return out


def alexnet_profile(batch: int = DEFAULT_BATCH, gpu_flops: float = DEFAULT_GPU_FLOPS,
                    efficiency: float = DEFAULT_EFFICIENCY, image_size: int = 224,
                    classes: int = 1000) -> list[LayerProfile]:
    """AlexNet (torchvision's: 5 conv + 3 FC, 61.1M parameters) at ``batch`` images per rank.

    Compute seconds = FLOPs / (``gpu_flops`` x ``efficiency``): ``gpu_flops`` is one GPU's peak
    FLOP/s (default 125e12, :data:`GPU_PEAK_FLOPS` ``"v100-tensor"``; a Tesla P40 is 11.76e12) and
    ``efficiency`` the share of it sustained (default 0.11: one GPU then trains about 3.3K images/s,
    what GradientFlow's 410.2x / 1.5 min on 512 GPUs implies). Forward FLOPs: 2 per multiply-add
    plus the bias adds (ReLU, pooling, dropout are left out); backward: twice the forward (input
    and weight gradients), once for the first layer (no input gradient).
    """
    for name, value in (("batch", batch), ("image_size", image_size), ("classes", classes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ProfileError(f"alexnet_profile: {name} must be an integer >= 1; got {value!r}")
    for name, value in (("gpu_flops", gpu_flops), ("efficiency", efficiency)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
            raise ProfileError(f"alexnet_profile: {name} must be a number > 0; got {value!r}")
    rate = gpu_flops * efficiency
    layers = []
    for i, (name, tensors, flops) in enumerate(layer_flops(ALEXNET_LAYERS, image_size, 3, classes)):
        forward = flops * batch / rate
        layers.append(LayerProfile(name, sum(tensors), forward, forward * (1 if i == 0 else 2), tensors))
    return layers
