"""``RunConfig``: one training run, every option declared once, validated before any process starts.

Each field of :class:`RunConfig` is declared with :func:`option`: its default, a one-line help, the
check of its allowed values, its command-line flag and which algorithms use it. The CLI
(:mod:`workbench.cli.training`), the algorithms' definitions (:meth:`~workbench.optim.definition.Algorithm.uses`),
sweeps and ``workbench compare`` (:func:`without_ignored`) all read those declarations
(:func:`options`); adding an option is one field here (docs/architecture.md, "How to add an option").

Every bad value raises :class:`ConfigError` naming the parameter and what is allowed. The fields
keep what the caller gave: ``lr``, ``momentum`` and ``rho`` left as ``None`` mean the algorithm's
defaults and the paper's ``beta = p*lr*rho = 0.9``, computed by :attr:`RunConfig.hyper`, never
written back, so a config read back from JSON equals the one written.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from .checks import integer
from .paths import shared_files  # noqa: F401 - re-exported: where results' modes are decided
from .comm.hookspec import check_hook
from .comm.names import algorithm_names as collective_names
from .comm.options import PRESETS, WIRE_DTYPES, Communication, CommunicationError, resolve
from .lr_schedules import LR_SCHEDULES
from .optim.registry import ALGORITHMS, UnknownAlgorithm, definition_of
from .options import (ConfigError, Option, boolean_check, dict_check, integer_check, number_check, one_of, option,
                      optional_integer_check, string_check)

BETA = 0.9  # the paper's moving rate p*alpha
#: Seeds go to torch.manual_seed, numpy and scikit-learn (``random_state``); numpy's legacy
#: generator, which scikit-learn uses, takes 0 .. 2**32 - 1, the narrowest of the three.
MAX_SEED = 2**32 - 1
#: seconds one gradient bucket's all-reduce may take before the rank gives up (a backstop: a
#: failing rank normally brings the whole job down at once)
COMM_TIMEOUT = 600.0
_COMM = {f.name: f.default for f in dataclasses.fields(Communication)}


@cache
def options() -> dict[str, Option]:
    """Every declared option by field name, in declaration order."""
    found = {}
    for f in dataclasses.fields(RunConfig):
        declared = f.metadata["option"]
        flag = "--" + f.name.replace("_", "-") if declared.flag == "" else declared.flag
        found[f.name] = dataclasses.replace(declared, name=f.name, flag=flag)
    return found


def scoped() -> dict[str, Option]:
    """The options only some algorithms take (an algorithm whose definition does not list one refuses it)."""
    return {name: opt for name, opt in options().items() if opt.scoped}


def _algorithm_check(name: str, value) -> None:
    """A built-in algorithm's name, or ``package.module:NAME`` of a definition in the user's module."""
    string_check(name, value)
    try:
        spec = definition_of(value)
    except UnknownAlgorithm as exc:
        raise ConfigError(str(exc)) from None
    unknown = sorted(spec.options - set(scoped()))
    if unknown:
        raise ConfigError(f"algorithm {value!r}: its definition takes {', '.join(unknown)}, which no option is (those "
                          f"only some algorithms take: {', '.join(scoped())})")



_PERIODIC = ("{algorithm} ignores {name}={value!r}; leave it unset ({name} applies to the periodic-averaging "
             "algorithms: {users})")
_OUTER = "{algorithm} has no outer optimizer and ignores {name}={value!r}; leave it unset (it applies to {users})"
_STREAMING = "{algorithm} syncs all parameters at once and ignores {name}={value!r}; leave it unset (it applies to {users})"
#: the inner optimizers of the periodic-averaging algorithms, and AdamW's default learning rate
INNER_OPTIMIZERS = ("sgd", "adamw")
ADAMW_LR = 1e-3
#: the dtypes DiLoCo's outer gradients may travel in
OUTER_WIRE_DTYPES = ("fp32", "bf16", "fp16")
_STRATEGY = ("{algorithm} {what}, so it cannot use {name}={value!r}; leave it unset (gradient-communication "
             "strategies apply to {users})")


class Hyper(NamedTuple):
    """The step's hyper-parameters as the run uses them (:attr:`RunConfig.hyper`)."""

    lr: float
    momentum: float
    rho: float


@dataclass
class RunConfig:
    """One training run (docs/getting-started.md, "In a notebook"; every option: ``workbench train --help``).

    Each field is an option declared once (:func:`option`): its default, its one line of help and the check of
    its values; the API reference's table "RunConfig's fields" lists them all, with their units. The fields keep
    what the caller gave: ``lr``, ``momentum`` and ``rho`` left as ``None`` mean the algorithm's defaults,
    computed by :attr:`hyper` and never written back.

    Args:
        single_buffer: deprecated (one release, with a DeprecationWarning): ``single_buffer=False`` is
            ``fusion_bytes=0`` (one message per tensor); ``True`` changes nothing.

    Raises:
        ConfigError: at construction, before any process starts, with one line naming the option: a field's
            value its option does not allow; or fields that disagree: ``max_restarts`` without
            ``checkpoint_every``, ``min_ranks`` or ``planned_ranks`` against ``ranks``, a master-based
            algorithm on fewer than 2 ranks, ``p * lr * rho >= 2`` for an elastic algorithm (``p`` workers),
            a field that contradicts the ``communication`` preset, an option the algorithm ignores, a
            ``comm_hook`` that does not load or comes with ``sparse_ratio``, a model that does not fit the
            data set, a ``batch_size`` larger than a worker's shard, the algorithm's own checks
            (:meth:`~workbench.optim.definition.Algorithm.check`), ``fail_rank`` without ``fail_step``, or
            ``single_buffer=False`` with a ``fusion_bytes`` other than 0.
    """

    algorithm: str = option("sync-easgd", "the training algorithm (`workbench algorithms`), or "
                                          "'package.module:NAME' for an Algorithm defined in your module",
                            check=_algorithm_check, flag=None)
    ranks: int = option(4, "MPI ranks", check=integer_check(1), type=int)
    model: str = option("mlp", "mlp, wide_mlp, cnn, lenet, resnet18, alexnet, or module:function", check=string_check)
    dataset: str = option("digits", "digits, synthetic, synthetic-imagenet, fashion-mnist, idx:FOLDER (MNIST format) or a .npz path",
                          check=string_check)
    epochs: int = option(10, "passes over each worker's shard", check=integer_check(1), type=int)
    lr: float | None = option(None, "learning rate (default: the algorithm's)",
                              check=number_check(lambda v: v > 0, "> 0", optional=True), type=float)
    lr_schedule: str = option("constant", "learning rate over the run: constant, cosine (from lr towards 0 at the "
                                          "last step) or step (lr/10 at half the run, lr/100 at three quarters); "
                                          "a master-based algorithm's master follows its arrivals",
                              check=one_of(lambda: LR_SCHEDULES), metavar="SCHEDULE")
    rho: float | None = option(None, "elastic coefficient (default: p*lr*rho = 0.9)",
                               check=number_check(lambda v: v >= 0, ">= 0", optional=True), type=float,
                               scoped=True,
                               ignored="{algorithm} has no elastic term and ignores rho={value!r}; leave rho unset "
                                       "(it applies to {users})")
    tau: int = option(1, "communication period in steps", check=integer_check(1), type=int,
                      scoped=True,
                      ignored="{algorithm} ignores tau={value!r}; leave it at 1 (tau is the communication period "
                              "of the EASGD family and of the master-based algorithms; local-sgd and the DiLoCo "
                              "family take sync_every)")
    momentum: float | None = option(None, "momentum (default: the algorithm's)",
                                    check=number_check(lambda v: 0 <= v < 1, "in [0, 1)", optional=True), type=float,
                                    scoped=True, neutral=(0,),
                                    ignored="{algorithm} does not use momentum (got {value!r}); leave it unset "
                                            "(async-measgd is momentum EASGD)")
    batch_size: int = option(16, "samples per worker step", check=integer_check(1), type=int)
    label_smoothing: float = option(0.0, "label smoothing of the training loss, in [0, 1)",
                                    check=number_check(lambda v: 0 <= v < 1, "in [0, 1)"), type=float)
    seed: int = option(0, "seeds torch, numpy and scikit-learn",
                       check=integer_check(0, MAX_SEED, " (2**32 - 1, what numpy and scikit-learn accept)"), type=int)
    collective: str = option("native", f"all-reduce algorithm of the synchronous algorithms: {', '.join(collective_names())}",
                             check=one_of(collective_names), scoped=True,
                             ignored="{algorithm} runs no all-reduce of its own, so it ignores collective={value!r}; leave "
                                     "it at 'native' (the collective applies to {users})")
    overlap: bool = option(True, "overlap communication with compute: sync-sgd issues gradient buckets from the "
                                 "backward hooks; the EASGD family exchanges weights while the gradient is computed",
                           check=boolean_check)
    # gradient communication (GradientFlow; workbench.comm.options): a preset, then the options themselves
    communication: str | dict | None = option(
        None, f"a preset of the gradient-communication options: {', '.join(PRESETS)}", metavar="PRESET",
        group="gradient communication")
    fusion_bytes: int | None = option(
        _COMM["fusion_bytes"], "bucket threshold in bytes (4096, 64K, 1M; 0 = one message per tensor; inf = one "
                               "message per step, the default); master-based algorithms: 0 or inf",
        check=optional_integer_check, metavar="N", group="gradient communication")
    wire_dtype: str = option(_COMM["wire_dtype"], f"dtype of the gradients on the wire: {', '.join(WIRE_DTYPES)}",
                             check=string_check, scoped=True, metavar="DTYPE", group="gradient communication")
    sparse_ratio: float | None = option(
        _COMM["sparse_ratio"], "coarse-grained sparse communication (CSC): share of chunks sent, in (0, 1]",
        scoped=True, type=float, metavar="R", group="gradient communication")
    sparse_chunk: int = option(_COMM["sparse_chunk"], "CSC chunk size in elements", type=int, metavar="C",
                               group="gradient communication")
    warmup_epochs: int = option(_COMM["warmup_epochs"], "CSC: dense first, the ratio falling to R over W epochs",
                                type=int, metavar="W", group="gradient communication")
    residual: bool = option(_COMM["residual"], "CSC: keep what was not sent (--no-residual: the ablation)",
                            group="gradient communication")
    momentum_correction: bool = option(_COMM["momentum_correction"], "CSC: momentum before the selection "
                                       "(--no-momentum-correction: after the exchange, the ablation)",
                                       group="gradient communication")
    carry_momentum: bool = option(_COMM["carry_momentum"], "CSC with momentum correction: the optimizer carries on "
                                  "the momentum that masking clears from the sent chunks (--no-carry-momentum: "
                                  "dropped, DGC as published)", group="gradient communication")
    clip_norm: float | None = option(_COMM["clip_norm"], "CSC: DGC's local gradient clipping on sparse steps: each "
                                     "rank's gradient scaled to an L2 norm of at most G/sqrt(ranks)", type=float,
                                     metavar="G", group="gradient communication")
    comm_hook: str | None = option(
        None, "a gradient hook 'module:function' in place of the dense all-reduce (function(state, bucket) -> Work; "
              "docs/architecture.md, \"How to add a communication hook\")",
        check=lambda name, value: value is None or check_hook(value, error=ConfigError), metavar="MODULE:FUNCTION",
        scoped=True, group="gradient communication",
        ignored="{algorithm} {what}, so it cannot use comm_hook={value!r}; leave it unset (gradient hooks apply to "
                "{users})")
    # EASGD's descendants (workbench.optim.periodic): Local SGD, DiLoCo, Streaming DiLoCo
    sync_every: int = option(10, "local-sgd, diloco, streaming-diloco: steps between averagings / outer steps (H)",
                             check=integer_check(1), type=int, metavar="H", scoped=True,
                             ignored=_PERIODIC, group="periodic averaging")
    warmup_steps: int = option(0, "the first W steps are sync-SGD (all-reduced gradients) before the periodic "
                                  "averaging starts (local-sgd: post-local SGD)", check=integer_check(0), type=int,
                               metavar="W", scoped=True, ignored=_PERIODIC,
                               group="periodic averaging")
    inner_optimizer: str = option("sgd", f"the workers' optimizer between exchanges: {', '.join(INNER_OPTIMIZERS)} "
                                         f"(adamw: lr default {ADAMW_LR:g}, betas 0.9/0.999)",
                                  check=one_of(lambda: INNER_OPTIMIZERS), metavar="OPT",
                                  scoped=True, ignored=_PERIODIC, group="periodic averaging")
    weight_decay: float = option(0.0, "the inner optimizer's weight decay (adamw: decoupled; sgd: added to the "
                                      "gradient)", check=number_check(lambda v: v >= 0, ">= 0"), type=float,
                                 scoped=True, ignored=_PERIODIC, group="periodic averaging")
    outer_lr: float = option(0.7, "diloco, streaming-diloco: the outer SGD's learning rate",
                             check=number_check(lambda v: v > 0, "> 0"), type=float,
                             scoped=True, ignored=_OUTER, group="periodic averaging")
    outer_momentum: float = option(0.9, "diloco, streaming-diloco: the outer SGD's momentum",
                                   check=number_check(lambda v: 0 <= v < 1, "in [0, 1)"), type=float,
                                   scoped=True, ignored=_OUTER, group="periodic averaging")
    nesterov: bool = option(True, "diloco, streaming-diloco: Nesterov momentum in the outer SGD (--no-nesterov: "
                                  "heavy ball)", check=boolean_check, scoped=True,
                            ignored=_OUTER, group="periodic averaging")
    outer_wire_dtype: str = option("fp32", f"diloco, streaming-diloco: dtype of the outer gradients on the wire: "
                                           f"{', '.join(OUTER_WIRE_DTYPES)}", check=one_of(lambda: OUTER_WIRE_DTYPES),
                                   metavar="DTYPE", scoped=True, ignored=_OUTER,
                                   group="periodic averaging")
    fragments: int = option(1, "streaming-diloco: parameter fragments, each synced once per sync_every steps, "
                               "staggered", check=integer_check(1), type=int, metavar="F",
                            scoped=True, ignored=_STREAMING, group="periodic averaging")
    sync_delay: int = option(0, "streaming-diloco: inner steps a fragment's exchange overlaps before its update "
                                "is applied (tau), < sync_every / fragments", check=integer_check(0), type=int,
                             metavar="TAU", scoped=True, ignored=_STREAMING,
                             group="periodic averaging")
    fragment_alpha: float = option(0.5, "streaming-diloco: a fragment's local weights become alpha*local + "
                                        "(1-alpha)*outer when its update arrives (0: replaced, as DiLoCo)",
                                   check=number_check(lambda v: 0 <= v <= 1, "in [0, 1]"), type=float, metavar="ALPHA",
                                   scoped=True, ignored=_STREAMING,
                                   group="periodic averaging")
    eval_every: int = option(0, "evaluate every N steps (master: arrivals); 0: each time every worker has trained "
                                "on as many rows as the test set holds, or each tenth of the run if sooner",
                             check=integer_check(0), type=int)
    checkpoint_every: int = option(0, "checkpoint every N steps (0: never)", check=integer_check(0), type=int)
    max_restarts: int = option(0, "a failed run starts again from its newest checkpoint, up to N times, as one run "
                                  "(needs --checkpoint-every)", check=integer_check(0), type=int, metavar="N")
    min_ranks: int | None = option(None, "with --max-restarts: a restart after a lost node goes on with the ranks of "
                                         "the nodes left, at least M, and grows back to --ranks as nodes return "
                                         "(default: only at full size)",
                                   check=lambda name, value: value is None or integer_check(1)(name, value),
                                   type=int, metavar="M")
    planned_ranks: int | None = option(None, "set by an elastic restart on fewer ranks than planned: the ranks the run "
                                             "was planned on; its steps and epochs stay those of that size",
                                       check=lambda name, value: value is None or integer_check(1)(name, value),
                                       flag=None)
    telemetry: bool = option(True, "record spans for the timeline (--no-telemetry: counters only)", check=boolean_check)
    synthetic_samples: int = option(4000, "samples of the synthetic dataset", check=integer_check(20), flag=None)
    subset: int | None = option(None, "keep only the first N rows of each split of the data set (default: all; a "
                                      "quick or throughput-only run on a real data set)",
                                check=lambda name, value: value is None or integer_check(1)(name, value),
                                type=int, metavar="N")
    fail_rank: int | None = option(None, "debug: make this rank raise at --fail-step", type=int)
    fail_step: int | None = option(None, "debug: the step at which --fail-rank raises", type=int)
    extra: dict = option({}, "free-form labels recorded with the run", check=dict_check, flag=None)
    #: deprecated (one release): ``single_buffer=False`` is ``fusion_bytes=0``
    single_buffer: dataclasses.InitVar[bool | None] = None

    def __post_init__(self, single_buffer: bool | None = None) -> None:
        for name, declared in options().items():
            if declared.check is not None:
                declared.check(name, getattr(self, name))
        if single_buffer is not None:
            self._single_buffer(single_buffer)
        if self.max_restarts and not self.checkpoint_every:
            raise ConfigError(f"max_restarts: a restart continues from the run's newest checkpoint, and this run writes "
                              f"none; set checkpoint_every (--checkpoint-every K) as well")
        spec = self.spec
        if spec.master_based and self.ranks < 2:  # before anything divides by the workers
            raise ConfigError(f"ranks must be >= 2 for {self.algorithm} (rank 0 is the master)")
        self._check_elastic()
        hyper = self.hyper
        if spec.elastic and self.workers * hyper.lr * hyper.rho >= 2:
            raise ConfigError(f"rho: p*lr*rho = {self.workers * hyper.lr * hyper.rho:.3g} must be < 2 "
                              f"for the center update to be stable (p={self.workers} workers)")
        comm = self.communication_options  # checks the gradient-communication options together
        ignored = ignored_options(self.algorithm, {**self.to_dict(), **self._preset()})
        if ignored:
            raise ConfigError(ignored[0][1])
        if self.comm_hook is not None and comm.sparse:
            raise ConfigError(f"comm_hook={self.comm_hook!r} replaces the all-reduce that coarse-grained sparse "
                              f"communication does; leave sparse_ratio unset (got {comm.sparse_ratio!r}) or drop comm_hook")
        self._check_hook()
        self._check_model_and_data()
        spec.check(self)  # the algorithm's own checks (its definition)
        self._check_failure()

    def _check_elastic(self) -> None:
        """``min_ranks`` against the ranks and the restarts; ``planned_ranks`` at least the ranks."""
        planned = self.planned_ranks if self.planned_ranks is not None else self.ranks
        if self.planned_ranks is not None and self.planned_ranks < self.ranks:
            raise ConfigError(f"planned_ranks: {self.planned_ranks} is fewer than ranks {self.ranks}; an elastic "
                              f"restart runs on at most the ranks it was planned on")
        if self.min_ranks is None:
            return
        if not self.max_restarts:
            raise ConfigError(f"min_ranks: {self.min_ranks} says how small a restart may go, and this run does not "
                              f"restart; set max_restarts (--max-restarts N) as well, or leave min_ranks out")
        if self.min_ranks > planned:
            raise ConfigError(f"min_ranks: {self.min_ranks} is more than the run's {planned} ranks; give 1..{planned}")
        if self.spec.master_based and self.min_ranks < 2:
            raise ConfigError(f"min_ranks: {self.algorithm} needs a master and at least one worker: give 2..{planned}")

    def _single_buffer(self, single_buffer: bool) -> None:
        """The deprecated ``single_buffer`` keyword, said as ``fusion_bytes``."""
        boolean_check("single_buffer", single_buffer)
        warnings.warn("RunConfig(single_buffer=...) is deprecated: single_buffer=False is fusion_bytes=0 (one "
                      "message per tensor)", DeprecationWarning, stacklevel=4)
        if not single_buffer:
            if self.fusion_bytes not in (None, 0):
                raise ConfigError(f"single_buffer=False is fusion_bytes=0 (one message per tensor); it contradicts "
                                  f"fusion_bytes={self.fusion_bytes!r}: give one of them")
            self.fusion_bytes = 0

    def _preset(self) -> dict[str, Any]:
        """The options ``communication`` stands for; ConfigError when a field given says otherwise."""
        try:
            preset = resolve(self.communication)
        except CommunicationError as exc:
            raise ConfigError(str(exc)) from None
        for name, value in preset.items():
            mine = getattr(self, name)
            if mine != options()[name].default and mine != value:
                raise ConfigError(f"{name}={mine!r} contradicts communication={self.communication!r}, which sets "
                                  f"{name}={value!r}; give one of them")
        return preset

    def _check_failure(self) -> None:
        if (self.fail_rank is None) != (self.fail_step is None):
            raise ConfigError("fail_rank and fail_step go together (both set or both unset)")
        if self.fail_rank is not None:
            if (not isinstance(self.fail_rank, int) or isinstance(self.fail_rank, bool)
                    or not 0 <= self.fail_rank < self.ranks):
                raise ConfigError(f"fail_rank must be a rank in 0..{self.ranks - 1}; got {self.fail_rank!r}")
            integer("fail_step", self.fail_step, 0, error=ConfigError)

    # -- derived: computed from the fields, never written into them --------------------------
    @property
    def hyper(self) -> Hyper:
        """``lr``, ``momentum`` and ``rho`` as the run uses them (a :class:`Hyper`): the caller's, else the
        algorithm's defaults (registry) and ``rho = BETA / (p * lr)`` with ``p`` workers. An AdamW inner
        optimizer has its own default lr (:data:`ADAMW_LR`) and no momentum (:func:`hyper_of`)."""
        # not to_dict(): asdict deep-copies every field, and the update rules read this every step
        return hyper_of({name: getattr(self, name)
                         for name in ("algorithm", "ranks", "lr", "momentum", "rho", "inner_optimizer")})

    @property
    def communication_options(self) -> Communication:
        """The gradient-communication options (a ``Communication``): the preset's, with the fields given.
        ``overlap`` means the gradient hooks for sync-sgd; Sync EASGD and the master-based EASGD workers
        overlap their weight exchange with the gradient computation instead.

        Raises:
            ConfigError: the options together are not allowed, or a field contradicts the preset.
        """
        values = {name: getattr(self, name) for name in _COMM}
        try:
            return Communication(**{**values, **self._preset()})
        except CommunicationError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def data_sizes(self) -> dict[str, int | None]:
        """The keywords of :func:`workbench.data.load` and :func:`~workbench.data.describe` that size
        the data set: ``samples`` (samples of a synthetic set) and ``subset`` (rows kept of each split;
        None: all)."""
        return {"samples": self.synthetic_samples, "subset": self.subset}

    @property
    def comm_timeout(self) -> float:
        """Seconds a rank waits for one all-reduce of a bucket (:data:`COMM_TIMEOUT`)."""
        return COMM_TIMEOUT

    @property
    def spec(self):
        """The algorithm's definition (:class:`~workbench.optim.definition.Algorithm`), from the registry or
        the user's ``package.module:NAME``."""
        return definition_of(self.algorithm)

    @property
    def workers(self) -> int:
        """Ranks that train: all of them, or all but the master."""
        return self.ranks - 1 if self.spec.master_based else self.ranks

    def _check_hook(self) -> None:
        """A ``comm_hook`` is loaded once, as a ``module:function`` model is built once
        (:meth:`_check_model_and_data`): imported, callable as ``hook(state, bucket)``
        (:func:`~workbench.comm.hookspec.load_hook`), so a wrong one is refused here rather than by
        every rank. Only then is the user's module imported (it may import torch)."""
        if self.comm_hook is None:
            return
        from .comm.hookspec import load_hook
        try:
            load_hook(self.comm_hook)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_model_and_data(self) -> None:
        """The dataset's shapes and labels and the model against them, without torch for the
        built-in models and datasets (a ``module:function`` model is built once to check it)."""
        from . import data, models
        try:
            info = data.describe(self.dataset, **self.data_sizes)
        except ValueError as exc:
            raise ConfigError(str(exc) if str(exc).startswith("dataset") else f"dataset: {exc}") from None
        try:
            models.check_model(self.model, info.feature_shape, info.num_classes)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from None
        train = info.train_samples
        shard = train // self.workers
        if self.batch_size > shard:
            raise ConfigError(f"batch_size {self.batch_size} is larger than a worker's shard "
                              f"({shard} samples: {train} training samples over {self.workers} "
                              f"workers)")

    def __repr__(self) -> str:
        """``RunConfig(algorithm='diloco', ranks=8, epochs=3)``: the algorithm and the fields that differ from their
        defaults, as scikit-learn prints an estimator (:meth:`to_dict` has every field)."""
        shown = [f"{name}={getattr(self, name)!r}" for name, declared in options().items()
                 if name == "algorithm" or getattr(self, name) != declared.default]
        return f"RunConfig({', '.join(shown)})"

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field by name (a deep copy), as given: ``None`` stays ``None``
        (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text, keys sorted (the run directory's ``config.json``)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """A RunConfig from its fields by name (:meth:`to_dict`, a stored config).

        Args:
            values: field name -> value; a field left out takes its default; ``single_buffer`` is
                accepted (deprecated).

        Returns:
            (RunConfig): The validated RunConfig.

        Raises:
            ConfigError: a key that is no field (the message lists the known ones), or any value the
                constructor refuses.
        """
        known = {f.name for f in dataclasses.fields(cls)} | {"single_buffer"}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"unknown RunConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)


#: the value meaning "not set" of each option that only some algorithms use
UNSET = {name: opt.default for name, opt in scoped().items()}


def workers_of(values: dict[str, Any]) -> int:
    """:attr:`RunConfig.workers` of a RunConfig's fields as a dict (``to_dict()``, a stored config): the ranks
    that train, all but the master of a master-based algorithm. Raises what :func:`definition_of` raises for an
    algorithm it cannot find."""
    return values["ranks"] - 1 if definition_of(values["algorithm"]).master_based else values["ranks"]


def hyper_of(values: dict[str, Any]) -> Hyper:
    """:attr:`RunConfig.hyper` of a RunConfig's fields as a dict (``to_dict()``, a stored config):
    the caller's ``lr``, ``momentum`` and ``rho``, else the algorithm's and ``rho = BETA / (p * lr)``.
    An AdamW inner optimizer (the periodic-averaging family) has its own default lr
    (:data:`ADAMW_LR`) and no momentum (its betas)."""
    spec = definition_of(values["algorithm"])
    workers = workers_of(values)
    adamw = spec.uses("inner_optimizer") and values.get("inner_optimizer") == "adamw"
    lr = (ADAMW_LR if adamw else spec.default_lr) if values.get("lr") is None else values["lr"]
    momentum = (0.0 if adamw else spec.default_momentum) if values.get("momentum") is None else values["momentum"]
    rho = BETA / (workers * lr) if values.get("rho") is None else values["rho"]
    return Hyper(float(lr), float(momentum), float(rho))


def ignored_options(algorithm: str, values: dict[str, Any]) -> list[tuple[str, str]]:
    """The options in ``values`` that ``algorithm`` would silently ignore, as ``(name, why)``: those
    set to something other than their default while the option's declaration says the algorithm
    does not use it. A single run refuses these (:class:`ConfigError`); a sweep or ``workbench
    compare`` over several algorithms drops them for the algorithms that ignore them
    (:func:`without_ignored`)."""
    spec = definition_of(algorithm)
    what = "all-reduces weights, not gradients" if spec.synchronous else \
        "is master-based (workers exchange with rank 0, no all-reduce)"
    found = []
    for name, declared in scoped().items():
        value = values.get(name, declared.default)
        if declared.used_by(spec) or value == declared.default or value in declared.neutral:
            continue
        why = declared.ignored or _STRATEGY
        users = ", ".join(other for other, taker in ALGORITHMS.items() if declared.used_by(taker))
        found.append((name, f"{name}: " + why.format(algorithm=algorithm, value=value, users=users, what=what,
                                                     name=name)))
    return found


def without_ignored(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``values`` (RunConfig fields, ``algorithm`` among them) with the options its algorithm
    ignores reset to "not set", and their names. For sweeps and ``workbench compare``, where
    one set of options is shared by several algorithms."""
    algorithm = values.get("algorithm", "sync-easgd")
    try:
        definition_of(algorithm)
    except UnknownAlgorithm:
        return dict(values), []  # RunConfig names the bad algorithm
    preset = {}
    try:
        preset = resolve(values.get("communication"))
    except CommunicationError:
        pass  # RunConfig names it
    names = [name for name, _ in ignored_options(algorithm, {**values, **preset})]
    cleared = {name: UNSET[name] for name in names}
    if any(name in preset for name in names):  # the preset itself says what this algorithm ignores
        cleared["communication"] = None
    return {**values, **cleared}, names
