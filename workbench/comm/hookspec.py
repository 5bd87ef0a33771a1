"""A user's communication hook named as ``"module:function"`` (``RunConfig(comm_hook=...)``),
checked in two steps before any process starts, as a ``module:function`` model is
(:func:`workbench.models.check_model`): the option's own check finds the module without importing
it (:func:`check_hook`: no MPI, no torch), then ``RunConfig`` loads the function once
(:func:`load_hook`: imported, callable as ``hook(state, bucket)``), in the notebook kernel or the
CLI; the ranks load it again the same way.

The function is a hook with the built-in hooks' signature (:mod:`workbench.comm.hooks`)::

    def my_hook(state: HookState, bucket: GradBucket) -> Work:
        return bucket.wire.allreduce(bucket.buffer, bucket.numel)   # what allreduce_hook does

It replaces the dense all-reduce (sync-sgd's gradients; not with ``sparse_ratio``, CSC being a
hook itself): called for every bucket as soon as backward has produced it (with ``overlap``),
it starts the bucket's reduction and returns a :class:`~workbench.comm.hooks.Work` at once;
when that work is done ``bucket.buffer`` must hold the **sum** over ranks (the optimizer divides
by the rank count). ``state`` is a :class:`~workbench.comm.hooks.HookState` of its own, one per
run and rank, on which the hook may keep what it likes. With ``wire_dtype`` fp16/bf16 the hook is
wrapped in :func:`~workbench.comm.precision.wire_precision`, as the built-in ones are: what it sends
through ``bucket.wire.allreduce`` travels in half precision.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect

FORM = "'package.module:function' (a function hook(state, bucket) -> Work)"


def _parts(spec: object, error: type[ValueError] = ValueError) -> tuple[str, str]:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise error(f"comm_hook must be {FORM}; got {spec!r}")
    module, function = spec.split(":")
    if not all(p.isidentifier() for p in module.split(".")) or not function.isidentifier():
        raise error(f"comm_hook must be {FORM}; got {spec!r}")
    return module, function


def check_hook(spec: object, error: type[ValueError] = ValueError) -> None:
    """Raise ``error`` (one line, naming ``comm_hook``) unless ``spec`` is ``"module:function"``
    with a module that can be found. The module is not imported (it may import torch): the
    option's check runs for every RunConfig; the function is loaded and its signature checked
    after the algorithm is known to use a hook (:func:`load_hook`)."""
    module, _ = _parts(spec, error)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # a parent package that is missing or raises
        raise error(f"comm_hook {spec!r}: cannot find module {module!r}: {exc}") from None
    if found is None:
        raise error(f"comm_hook {spec!r}: cannot find module {module!r}")


def load_hook(spec: str):
    """Import ``spec``'s function; ValueError (one line, naming ``comm_hook``) if the module cannot
    be imported, or the name is not a callable that takes ``(state, bucket)`` as two positional
    arguments (``inspect.signature(hook).bind(state, bucket)``: extra parameters with defaults and
    ``*args`` are fine). A callable whose signature cannot be read (a builtin written in C without
    one) is refused too: it cannot be shown to take a hook's arguments, and would otherwise fail
    only on the ranks; a Python function wrapping it can be given instead."""
    from ..models import one_line
    module, function = _parts(spec)
    try:
        hook = getattr(importlib.import_module(module), function, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises while importing is as bad as a missing one
        raise ValueError(f"comm_hook {spec!r}: cannot import {module!r}: {one_line(exc)}") from None
    if not callable(hook):
        raise ValueError(f"comm_hook {spec!r}: {module} has no function {function!r}")
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):  # a builtin without a signature
        raise ValueError(f"comm_hook {spec!r}: the parameters of {module}.{function} cannot be read (a builtin?), so "
                         f"it cannot be shown to be a hook(state, bucket) -> Work; wrap it in a Python function "
                         f"def hook(state, bucket)") from None
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise ValueError(f"comm_hook {spec!r}: {module}.{function}{signature} cannot be called as hook(state, "
                         f"bucket) ({exc}); give a function of two positional parameters: def hook(state, bucket) "
                         f"-> Work") from None
    return hook
