"""What a burst-parallel run must equal: the single-process run of the same model on the same
global batches (:func:`reference`), and the pieces both share: the data (:func:`batches`), the
initial model, the loss and the SGD step. torch is imported where it is used.
"""
from __future__ import annotations

import numpy as np

from .graph import BurstError

NUM_FEATURES, NUM_CLASSES = 64, 10  # the digits data: 8x8 images, 10 classes


def batches(batch: int, steps: int, seed: int, dtype: str = "float32"):
    """``steps`` fixed global batches ``(X, y)`` of digits' training set, drawn with a generator
    seeded with ``seed`` (without replacement within a batch): the same on every rank."""
    import torch
    from ..data import digits
    data = digits()
    n = len(data.y_train)
    if batch > n:
        raise BurstError(f"batch {batch} exceeds the {n} training samples of digits")
    gen = torch.Generator().manual_seed(seed)
    idx = [torch.randperm(n, generator=gen)[:batch] for _ in range(steps)]
    return [(data.X_train[i].to(getattr(torch, dtype)), data.y_train[i]) for i in idx]


def initial_model(model_name: str, seed: int, dtype: str):
    """The model as every rank (and the reference) starts it: built after seeding torch with ``seed``."""
    import torch
    from ..models import build
    torch.manual_seed(seed)
    return build(model_name, NUM_FEATURES, NUM_CLASSES).to(getattr(torch, dtype))


def sgd_step(data, grad, buf, lr: float, momentum: float) -> None:
    """``torch.optim.SGD`` (no dampening, no weight decay) on flat tensors."""
    if momentum:
        grad = buf.mul_(momentum).add_(grad)
    data.add_(grad, alpha=-lr)


def batch_loss(out, y, batch: int):
    """Summed cross entropy over the global ``batch``: summed over ranks, the mean loss."""
    import torch.nn.functional as F
    return F.cross_entropy(out, y, reduction="sum") / batch


def reference(model_name: str, batch: int, steps: int, lr: float, seed: int, *, momentum: float = 0.0,
              dtype: str = "float32") -> np.ndarray:
    """The final flat weights of one process on the whole global batch (init, batches and SGD as
    :func:`~workbench.burst.execute.run_plan` has them)."""
    import torch

    from ..models import FlatParams
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = initial_model(model_name, seed, dtype)
        flat = FlatParams(model)
        buf = torch.zeros_like(flat.data)
        for X, y in batches(batch, steps, seed, dtype):
            flat.zero_grad()
            batch_loss(model(X), y, batch).backward()
            sgd_step(flat.data, flat.grad, buf, lr, momentum)
        return flat.data.numpy().copy()
    finally:
        torch.set_num_threads(threads)   # the caller's (a notebook's) own setting
