"""The model zoo and flat parameter buffers ("single-layer communication").

Models by name: ``mlp`` (small, for digits), ``wide_mlp`` (>= 1M parameters, so communication
matters), ``cnn`` (small convolutional net for 8x8 images), ``lenet`` (LeNet-5's two convolutions
and three dense layers, for square images of side >= 12: 61,706 parameters on 28x28 Fashion-MNIST),
``resnet18`` (torchvision's, adapted to small images: 62 parameter tensors, 11,172,810 parameters on
28x28x1 with 10 classes) and ``alexnet`` (torchvision's, GradientFlow's model: 61,100,840 parameters on
3x224x224 with 1000 classes; ``dataset="synthetic-imagenet"`` for throughput runs). Any user model works through the
same path: ``model="package.module:function"`` names a function ``(num_features, num_classes)
-> torch.nn.Module`` that every rank imports. Importing it runs that module's code in the
process that validates the configuration (notebook kernel, CLI) and on every rank;
:func:`check_model` builds it once there and runs a forward pass on zeros, so a factory that
raises, returns something else, or whose input/output sizes do not fit the data is refused
before any rank starts. torch is imported only when a model is built (validating a built-in
model needs no torch).

:class:`FlatParams` makes every parameter (and gradient) a view into one contiguous tensor, so
all layers travel as one message; ``segments()`` gives the per-layer views for the
one-message-per-layer ablation.
"""
from __future__ import annotations

import functools
import importlib
import math

BUILTIN_MODELS = ("mlp", "wide_mlp", "cnn", "lenet", "resnet18", "alexnet")
#: the smallest image side each image model takes: LeNet-5's 5x5 convolutions and two 2x2
#: poolings leave >= 1 pixel from 12; AlexNet's 11x11/4 convolution and three 3x3/2 poolings from 63
MIN_SIDE = {"cnn": 1, "lenet": 12, "resnet18": 1, "alexnet": 63}
_TV_FRAGMENT = None


@functools.cache
def _image_class():
    """``_Image``: reshape flat rows to channels x side x side images (made on first use: torch is lazy)."""
    from torch import nn

    class _Image(nn.Module):
        def __init__(self, side: int, channels: int = 1) -> None:
            super().__init__()
            self.side, self.channels = side, channels

        def forward(self, x):
            return x.view(x.shape[0], self.channels, self.side, self.side)

    return _Image


def build(name: str, num_features: int, num_classes: int) -> nn.Module:
    """A model by name, or ``"module:function"`` for a user model."""
    from torch import nn
    _Image = _image_class()
    if name == "mlp":
        return nn.Sequential(nn.Linear(num_features, 64), nn.ReLU(), nn.Linear(64, num_classes))
    if name == "wide_mlp":
        return nn.Sequential(nn.Linear(num_features, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                             nn.ReLU(), nn.Linear(1024, num_classes))
    if name == "cnn":
        side = int(round(num_features ** 0.5))
        if side * side != num_features:
            raise ValueError(f"model 'cnn' needs square images; {num_features} features is not")
        return nn.Sequential(_Image(side), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * (side // 2) ** 2, num_classes))
    if name == "lenet":
        side = math.isqrt(num_features)
        out = ((side // 2) - 4) // 2  # conv 5x5 (padded), pool 2, conv 5x5, pool 2
        return nn.Sequential(_Image(side), nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(16 * out * out, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                             nn.Linear(84, num_classes))
    if name in ("resnet18", "alexnet"):
        return _torchvision_model(name, num_features, num_classes)
    if ":" in name:
        module_name, _, attr = name.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        model = factory(num_features, num_classes)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    raise ValueError(f"model must be one of {', '.join(BUILTIN_MODELS)} or 'module:function'; "
                     f"got {name!r}")


def image_shape(num_features: int) -> tuple[int, int] | None:
    """(channels, side) of flat square images of ``num_features`` pixels: one channel when it is
    a square (784: 28x28), three when a third of it is (150,528: 3x224x224); else None."""
    for channels in (1, 3):
        side = math.isqrt(num_features // channels)
        if num_features % channels == 0 and side * side * channels == num_features and side > 0:
            return channels, side
    return None


def _torchvision_model(name: str, num_features: int, num_classes: int) -> nn.Module:
    """torchvision's ``resnet18`` or ``alexnet`` (``weights=None``: nothing is downloaded) on flat
    square images. resnet18 is adapted to small images as for CIFAR: a 3x3 stride-1 first
    convolution and no max-pooling (on 28x28 the 7x7/2 stem and pooling would leave 7x7 before the
    first block); alexnet is torchvision's own (GradientFlow's model, for 224x224 inputs)."""
    from torch import nn
    channels, side = image_shape(num_features)
    tv = import_torchvision()
    if name == "alexnet":
        model = tv.models.alexnet(weights=None, num_classes=num_classes)
        if channels != 3:
            model.features[0] = nn.Conv2d(channels, 64, kernel_size=11, stride=4, padding=2)
    else:
        model = tv.models.resnet18(weights=None, num_classes=num_classes)
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return nn.Sequential(_image_class()(side, channels), model)


def import_torchvision():
    """``torchvision``, also where its C++ ops library cannot load: the wheel on this machine's
    index is built against CUDA torch and fails to load beside the CPU-only torch, after which
    torchvision's own import dies registering fake kernels for ``torchvision::nms``/``qnms``.
    Those two schemas are then declared here (no kernels: detection ops stay unusable; the model
    definitions are pure Python). ImportError when torchvision is not installed."""
    global _TV_FRAGMENT
    import torch
    try:
        import torchvision
    except ImportError:
        raise ImportError("torchvision is not installed (pip install -c constraints.txt torchvision)") from None
    except RuntimeError as exc:
        if "torchvision::" not in str(exc) or _TV_FRAGMENT is not None:
            raise
        _TV_FRAGMENT = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            _TV_FRAGMENT.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision
    return torchvision


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: an error of the user's code in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _factory(name: str):
    """The user's ``module:function``; ValueError if it cannot be imported or is not callable."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(f"model {name!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a module that raises while importing is as bad as a missing one
        raise ValueError(f"model {name!r}: cannot import {module_name!r}: {one_line(exc)}") from None
    if not callable(getattr(module, attr, None)):
        raise ValueError(f"model {name!r}: {module_name} has no function {attr!r}")
    return getattr(module, attr)


def check_model_name(name: str) -> None:
    """Raise ValueError for a name that is neither built in nor importable as module:function."""
    if not isinstance(name, str):
        raise ValueError(f"model must be a string; got {type(name).__name__}")
    if name in BUILTIN_MODELS:
        return
    if ":" not in name:
        raise ValueError(f"model must be one of {', '.join(BUILTIN_MODELS)} or 'module:function'; "
                         f"got {name!r}")
    _factory(name)


def check_model(name: str, feature_shape: tuple[int, ...], num_classes: int) -> None:
    """Raise ValueError (one line, naming the model) unless ``name`` builds a model that takes a
    batch of samples shaped ``feature_shape`` and returns ``num_classes`` scores per sample.

    Built-in models are checked by arithmetic (no torch); a user model is built once and run
    forward on two zero samples, inside ``torch.random.fork_rng`` so the caller's random state
    is left as it was."""
    check_model_name(name)
    num_features = math.prod(feature_shape)
    if name in BUILTIN_MODELS:
        if len(feature_shape) != 1:
            raise ValueError(f"model {name!r} takes flat feature vectors; the data's samples have shape "
                             f"{feature_shape} (flatten X to (samples, {num_features}))")
        _check_image_model(name, num_features)
        return
    import torch
    factory = _factory(name)
    with torch.random.fork_rng(devices=[]):
        try:
            model = factory(num_features, num_classes)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"model {name!r}: {name}({num_features}, {num_classes}) raised "
                             f"{one_line(exc)}") from None
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
        try:
            with torch.no_grad():
                out = model(torch.zeros((2, *feature_shape)))
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"model {name!r}: its input does not fit the data (samples of shape "
                             f"{feature_shape}, {num_features} features): {one_line(exc)}") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model {name!r}: output must be (batch, {num_classes}) class scores for the "
                         f"data's {num_classes} classes; got {got} for a batch of 2")


def _check_image_model(name: str, num_features: int) -> None:
    """ValueError unless the image model ``name`` takes ``num_features`` flat pixels (by arithmetic)."""
    if name not in MIN_SIDE:
        return
    shape = image_shape(num_features)
    channels = (1, 3) if name in ("resnet18", "alexnet") else (1,)
    if shape is None or shape[0] not in channels or shape[1] < MIN_SIDE[name]:
        what = {"cnn": "square images", "lenet": f"square images of side >= {MIN_SIDE['lenet']} (28x28: fashion-mnist)",
                "resnet18": "square images of 1 or 3 channels (28x28: fashion-mnist)",
                "alexnet": f"square images of 1 or 3 channels and side >= {MIN_SIDE['alexnet']} (3x224x224: "
                           "synthetic-imagenet)"}[name]
        raise ValueError(f"model {name!r} needs {what}; {num_features} features is not one")


def tensor_count(name: str, feature_shape: tuple[int, ...], num_classes: int) -> int:
    """How many trainable parameter tensors the model ``name`` has for this data (built on torch's
    ``meta`` device: shapes only, no memory, no random numbers drawn)."""
    import torch
    with torch.device("meta"):
        model = build(name, math.prod(feature_shape), num_classes)
    return sum(1 for p in model.parameters() if p.requires_grad)


class FlatParams:
    """All trainable parameters of ``module`` as views into one contiguous tensor of their dtype
    (float32 unless the module was converted).

    ``data`` holds the weights and ``grad`` the gradients; both are single buffers that MPI can
    send in one message. Gradients must be cleared with :meth:`zero_grad` (which keeps the
    views), never with ``module.zero_grad()`` (which would drop them).
    """

    def __init__(self, module: nn.Module) -> None:
        import torch
        self.params = [p for p in module.parameters() if p.requires_grad]
        total = sum(p.numel() for p in self.params)
        dtype = self.params[0].dtype if self.params else torch.float32
        self.data = torch.empty(total, dtype=dtype)
        self.grad = torch.zeros(total, dtype=dtype)
        self.bounds = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.data[offset:offset + n].copy_(p.detach().reshape(-1))
                p.data = self.data[offset:offset + n].view_as(p)
                p.grad = self.grad[offset:offset + n].view_as(p)
                self.bounds.append((offset, offset + n))
                offset += n

    @property
    def numel(self) -> int:
        return self.data.numel()

    def zero_grad(self) -> None:
        self.grad.zero_()

    def check_grads_are_views(self) -> None:
        """Autograd accumulates into existing ``.grad`` in place; make sure it still does."""
        for p, (a, b) in zip(self.params, self.bounds):
            if p.grad is None or p.grad.data_ptr() != self.grad[a:b].data_ptr():
                raise RuntimeError("a gradient is no longer a view of the flat buffer (did something "
                                   "call module.zero_grad()?)")

    def segments(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-layer views of a flat tensor laid out like ``data``."""
        return [flat[a:b] for a, b in self.bounds]
