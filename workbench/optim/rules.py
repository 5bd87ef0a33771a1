"""The update formulas, as pure functions on tensors (no communication, inputs untouched), and
momentum SGD's in-place twin (``momentum_sgd_``: the same bits, no model-sized temporaries, for the
training loops' hot path).

Notation (You, Buluç and Demmel, "Scaling Deep Learning on GPU and Knights Landing Clusters", SC 2017):
``lr`` = eta, ``rho`` = elastic coefficient, ``alpha = lr*rho``
(the moving rate), ``p`` = number of workers, ``beta = p*alpha``. Every algorithm applies its
maths through these functions, so the maths lives in one readable place.
"""
from __future__ import annotations

import torch
from torch import Tensor



def elastic_worker(x: Tensor, grad: Tensor, center: Tensor, lr: float, rho: float) -> Tensor:
    """EASGD worker step: ``x - lr*grad - lr*rho*(x - center)``."""
    return x - lr * grad - lr * rho * (x - center)


def elastic_center(center: Tensor, x: Tensor, lr: float, rho: float) -> Tensor:
    """Center update for one arriving worker: ``center + lr*rho*(x - center)``."""
    return center + lr * rho * (x - center)


def elastic_center_sync(center: Tensor, x_mean: Tensor, lr: float, rho: float, p: int) -> Tensor:
    """Synchronous center update from all ``p`` workers: ``center + p*lr*rho*(x_mean - center)``."""
    return center + p * lr * rho * (x_mean - center)


def momentum_elastic_worker(x: Tensor, v: Tensor, grad: Tensor, center: Tensor, lr: float,
                            rho: float, momentum: float) -> tuple[Tensor, Tensor]:
    """MEASGD worker step (SC'17 form); returns ``(x', v')``.

    ``v' = momentum*v - lr*grad``; ``x' = x + v' - lr*rho*(x - center)``.
    """
    v_new = momentum * v - lr * grad
    return x + v_new - lr * rho * (x - center), v_new


def sgd(x: Tensor, grad: Tensor, lr: float) -> Tensor:
    """Plain SGD: ``x - lr*grad``. Also the local step of EASGD between exchanges (tau > 1)."""
    return x - lr * grad


def momentum_sgd(x: Tensor, v: Tensor, grad: Tensor, lr: float, momentum: float) -> tuple[Tensor, Tensor]:
    """Heavy-ball momentum SGD; returns ``(x', v')``: ``v' = momentum*v - lr*grad``, ``x' = x + v'``."""
    v_new = momentum * v - lr * grad
    return x + v_new, v_new


def carried_momentum_sgd(x: Tensor, v: Tensor, grad: Tensor, carried: Tensor | float, lr: float,
                         momentum: float) -> tuple[Tensor, Tensor]:
    """Momentum SGD for a gradient that already carries momentum (CSC's momentum correction sends
    momentum-SGD steps); returns ``(x', v')``: ``x' = x - lr*grad + momentum*v``;
    ``v' = momentum*v - lr*carried*grad``. ``carried`` (per element, in [0, 1]) is the share of
    ``grad`` that was momentum cleared at the sender, which momentum SGD would go on applying:
    ``carried = 1`` everywhere is :func:`momentum_sgd` exactly, ``carried = 0`` everywhere with
    ``v = 0`` is plain SGD (DGC's momentum factor masking as published)."""
    v_new = momentum * v - lr * (carried * grad)
    return x - lr * grad + momentum * v, v_new


def momentum_sgd_(x: Tensor, v: Tensor, grad: Tensor, lr: float, momentum: float, scratch: Tensor) -> None:
    """:func:`momentum_sgd` in place: ``x`` and ``v`` become ``x'`` and ``v'``, the same bits (each
    elementwise operation in its order), ``lr*grad`` in ``scratch`` (a tensor like ``x``; it may be
    ``grad`` itself). The functional form makes model-sized temporaries a step, each faulted in page by
    page: on AlexNet a step took several times as long as in place (benchmarks/README.md, "GradientFlow on a
    virtual cluster")."""
    torch.mul(grad, lr, out=scratch)   # lr * grad
    v.mul_(momentum).sub_(scratch)     # v' = momentum * v - lr * grad
    x.add_(v)                          # x' = x + v'


# In-place twins of the formulas above, for the training loops' hot paths: each gives the same bits
# as its functional form (every elementwise operation in the same order; tests/test_rules.py), with
# the model-sized temporaries in scratch tensors the caller keeps (``s1``, ``s2``: tensors like ``x``).
def sgd_(x: Tensor, grad: Tensor, lr: float, s1: Tensor) -> None:
    """:func:`sgd` in place: ``x`` becomes ``x - lr*grad``."""
    x.sub_(torch.mul(grad, lr, out=s1))


def elastic_worker_(x: Tensor, grad: Tensor, center: Tensor, lr: float, rho: float, s1: Tensor, s2: Tensor) -> None:
    """:func:`elastic_worker` in place: ``x`` becomes ``x - lr*grad - lr*rho*(x - center)``."""
    torch.mul(grad, lr, out=s1)
    torch.sub(x, center, out=s2).mul_(lr * rho)
    x.sub_(s1).sub_(s2)


def momentum_elastic_worker_(x: Tensor, v: Tensor, grad: Tensor, center: Tensor, lr: float, rho: float,
                             momentum: float, s1: Tensor, s2: Tensor) -> None:
    """:func:`momentum_elastic_worker` in place: ``x`` and ``v`` become ``x'`` and ``v'``."""
    v.mul_(momentum).sub_(torch.mul(grad, lr, out=s1))
    torch.sub(x, center, out=s2).mul_(lr * rho)
    x.add_(v).sub_(s2)


def elastic_center_(center: Tensor, x: Tensor, lr: float, rho: float, s1: Tensor) -> None:
    """:func:`elastic_center` in place: ``center`` becomes ``center + lr*rho*(x - center)``."""
    center.add_(torch.sub(x, center, out=s1).mul_(lr * rho))


def elastic_center_sync_(center: Tensor, x_mean: Tensor, lr: float, rho: float, p: int, s1: Tensor) -> None:
    """:func:`elastic_center_sync` in place: ``center`` becomes ``center + p*lr*rho*(x_mean - center)``."""
    center.add_(torch.sub(x_mean, center, out=s1).mul_(p * lr * rho))


def adamw_(x: Tensor, m: Tensor, v: Tensor, grad: Tensor, t: int, lr: float, weight_decay: float, s1: Tensor,
           s2: Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """:func:`adamw` in place: ``x``, ``m`` and ``v`` become ``x'``, ``m'`` and ``v'``."""
    b1, b2 = betas
    m.mul_(b1).add_(torch.mul(grad, 1 - b1, out=s1))
    v.mul_(b2).add_(torch.mul(grad, 1 - b2, out=s1).mul_(grad))
    denom = torch.sqrt(v, out=s1).div_((1 - b2 ** t) ** 0.5).add_(eps)
    step = torch.mul(m, lr / (1 - b1 ** t), out=s2).div_(denom)
    x.mul_(1 - lr * weight_decay).sub_(step)



# -- EASGD's descendants (workbench.optim.periodic) ------------------------------------------------
def outer_sgd(theta: Tensor, buf: Tensor, delta: Tensor, lr: float, momentum: float,
              nesterov: bool) -> tuple[Tensor, Tensor]:
    """DiLoCo's outer step on the outer gradient ``delta`` (outer weights minus the workers' mean),
    torch's SGD with momentum; returns ``(theta', buf')``: ``buf' = momentum*buf + delta``;
    ``theta' = theta - lr*(delta + momentum*buf')`` with Nesterov, ``theta - lr*buf'`` without.
    (torch starts ``buf`` at the first ``delta``; a zero ``buf`` gives the same.)"""
    buf_new = momentum * buf + delta
    step = delta + momentum * buf_new if nesterov else buf_new
    return theta - lr * step, buf_new


def adamw(x: Tensor, m: Tensor, v: Tensor, grad: Tensor, t: int, lr: float, weight_decay: float,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> tuple[Tensor, Tensor, Tensor]:
    """AdamW (Loshchilov and Hutter; torch.optim.AdamW's arithmetic), step ``t`` >= 1; returns
    ``(x', m', v')``: ``x <- x(1 - lr*wd)``; ``m' = b1*m + (1-b1)*g``; ``v' = b2*v + (1-b2)*g^2``;
    ``x' = x - lr/(1-b1^t) * m' / (sqrt(v')/sqrt(1-b2^t) + eps)``."""
    b1, b2 = betas
    m_new = b1 * m + (1 - b1) * grad
    v_new = b2 * v + (1 - b2) * grad * grad
    denom = v_new.sqrt() / (1 - b2 ** t) ** 0.5 + eps
    return x * (1 - lr * weight_decay) - (lr / (1 - b1 ** t)) * m_new / denom, m_new, v_new


def mix(local: Tensor, outer: Tensor, alpha: float) -> Tensor:
    """Streaming DiLoCo's merge when a fragment's outer update arrives: ``alpha*local + (1-alpha)*outer``
    (``alpha = 0``: the local weights are replaced, as in DiLoCo)."""
    return alpha * local + (1 - alpha) * outer


def outer_sgd_(theta: Tensor, buf: Tensor, delta: Tensor, lr: float, momentum: float, nesterov: bool,
               s1: Tensor) -> None:
    """:func:`outer_sgd` in place: ``theta`` and ``buf`` become ``theta'`` and ``buf'``."""
    buf.mul_(momentum).add_(delta)
    if nesterov:
        theta.sub_(torch.mul(buf, momentum, out=s1).add_(delta).mul_(lr))
    else:
        theta.sub_(torch.mul(buf, lr, out=s1))


def mix_(local: Tensor, outer: Tensor, alpha: float, s1: Tensor) -> None:
    """:func:`mix` in place: ``local`` becomes ``alpha*local + (1-alpha)*outer``."""
    local.mul_(alpha).add_(torch.mul(outer, 1 - alpha, out=s1))
