"""This rank's copy of the model: the module, its parameters as one flat buffer, forward and backward
on a batch, and evaluation on a second copy (when and on what)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ... import data as data_mod
from ... import models
from ...config import RunConfig


class Replica:
    """The model this rank trains and the copy it tests weights on.

    Attributes:
        model: the module (a benchmark may swap in a wrapper of it, e.g. DDP: :meth:`backward` runs
            whatever is here).
        flat: its trainable parameters as views into one flat tensor (``flat.data``, ``flat.grad``).
    """

    #: test rows per forward pass of an evaluation (bounds its memory: resnet18's first block
    #: holds 200 KB of activations per 28x28 image)
    EVAL_ROWS = 500
    #: evaluations a run has at least by default (``eval_every`` 0), for its live curves
    EVALUATIONS = 10

    def __init__(self, cfg: RunConfig, data) -> None:
        self.cfg, self.data = cfg, data
        self.model = models.build(cfg.model, data.num_features, data.num_classes)
        self.flat = models.FlatParams(self.model)
        self._eval_model = models.build(cfg.model, data.num_features, data.num_classes)
        self._eval_flat = models.FlatParams(self._eval_model)
        self._eval_result = None  # (accuracy, loss) of the weights and buffers the evaluation model holds

    def backward(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward on the batch ``(X, y)``: the gradient in ``flat.grad`` (cleared first);
        returns the loss (a 0-d tensor)."""
        self.flat.zero_grad()
        loss = F.cross_entropy(self.model(X), y, label_smoothing=self.cfg.label_smoothing)
        loss.backward()
        return loss

    @torch.no_grad()
    def test(self, weights: torch.Tensor, span: Callable) -> tuple[float, float]:
        """Test accuracy and mean loss of ``weights`` (a flat vector) with this rank's buffers;
        ``span(name, cat)``: the telemetry span the pass over the test set is drawn in.

        Layers with running statistics (BatchNorm) take this rank's own: they are buffers, not
        parameters, so no algorithm exchanges them. Weights and buffers equal to the last ones
        tested (a synchronous run evaluates its last step, then its final weights) take that result
        again: resnet18 on Fashion-MNIST's 10,000 test rows is about 2 minutes here, the comparison
        20 ms. Compared by value, not by tensor version counters: MPI's receives into numpy views of
        a tensor do not bump them."""
        if self._eval_result is None or not self._holds(weights):
            self._eval_result = None  # until the test ends: the model holds these weights already
            self._eval_result = self._test(weights, span)
        return self._eval_result

    def _holds(self, weights: torch.Tensor) -> bool:
        """Whether the evaluation model holds ``weights`` and this rank's buffers now."""
        return torch.equal(self._eval_flat.data, weights) and all(
            torch.equal(mine, theirs) for mine, theirs in zip(self._eval_model.buffers(), self.model.buffers()))

    def _test(self, weights: torch.Tensor, span: Callable) -> tuple[float, float]:
        """Accuracy and mean loss on the test set of ``weights`` with this rank's buffers."""
        if len(self.data.y_test) == 0:  # a rank that was not meant to evaluate: read the test set now
            self.data.X_test, self.data.y_test = _test_set(self.cfg)
        with span("evaluate", "compute"):
            self._eval_flat.data.copy_(weights)
            for mine, theirs in zip(self._eval_model.buffers(), self.model.buffers()):
                mine.copy_(theirs)
            self._eval_model.eval()
            loss_sum, right, y = 0.0, 0, self.data.y_test
            for start in range(0, len(y), self.EVAL_ROWS):
                out = self._eval_model(self.data.X_test[start:start + self.EVAL_ROWS])
                part = y[start:start + self.EVAL_ROWS]
                loss_sum += F.cross_entropy(out, part, reduction="sum").item()
                right += int((out.argmax(1) == part).sum())
        return right / len(y), loss_sum / len(y)

    def is_eval_point(self, count: int, last: int) -> bool:
        """Whether the evaluating rank evaluates after step (master: arrival) ``count`` of ``last``."""
        return count % self.eval_interval(last) == 0 or count == last

    def eval_interval(self, last: int) -> int:
        """Steps (master: arrivals) between two evaluations in a run of ``last``: ``RunConfig.eval_every``,
        or for 0 (the default) the fewer of: as many as it takes every worker to train on as many rows
        as the test set holds, so that evaluating stays a fraction of a long run whatever the test set's
        size (digits' 360 rows at batch 16: 23 steps; Fashion-MNIST's 10,000: 625; a master counts every
        worker's arrivals); and a tenth of the run (:data:`EVALUATIONS`)."""
        cfg = self.cfg
        if cfg.eval_every:
            return cfg.eval_every
        if not len(self.data.y_test):  # a rank that does not evaluate
            return 1
        master = cfg.spec.master_based
        steps = -(-len(self.data.y_test) // (cfg.batch_size * (cfg.tau if master else 1)))
        return max(1, min(steps * cfg.workers if master else steps, -(-last // self.EVALUATIONS)))


def _test_set(cfg: RunConfig) -> tuple:
    """The test features and labels alone (no training rows)."""
    test = data_mod.load(cfg.dataset, **cfg.data_sizes, seed=cfg.seed, shard=(None, cfg.workers))
    return test.X_test, test.y_test
