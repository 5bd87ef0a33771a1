"""How a RunConfig option is declared: :class:`Option` (default, help, allowed values, CLI flag,
which algorithms take it) and the checks of allowed values, each raising
:class:`~workbench.config.ConfigError` with one line that names the option.

Hand-written rather than pydantic or traitlets: the type and range checks are the six small
functions below; what a library would not give us (the algorithms that use an option, the
message when one ignores it, the CLI flag) would be custom metadata either way, and the
messages must stay one line naming the option and the allowed values. Pure: standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .checks import finite_number, integer


class ConfigError(ValueError):
    """A RunConfig value that is not allowed; the message names the parameter."""


@dataclass(frozen=True)
class Option:
    """One RunConfig option, as :func:`option` declares it.

    Attributes:
        name: the field's name (filled in by :func:`options`).
        default: what an option not given means.
        help: one line for ``--help`` and the docs.
        check: ``check(name, value)`` raises :class:`ConfigError` unless ``value`` is allowed
            (None: any value; the cross-field checks live in :class:`RunConfig`).
        flag: the command-line flag (``--tau``); None: Python only.
        cli: ``argparse.add_argument`` keywords beyond the flag, default and help.
        scoped: only some algorithms take it: those whose definition lists it
            (:attr:`~workbench.optim.definition.Algorithm.options`); False: every algorithm does.
        ignored: why an algorithm that does not take it refuses it, ``{algorithm}`` and ``{value}``
            filled in.
        group: the ``--help`` section.
        neutral: values besides the default that an algorithm not using the option accepts
            (``momentum=0``: no momentum).
    """

    default: Any
    help: str
    check: Callable[[str, Any], None] | None = None
    flag: str | None = None
    cli: dict = field(default_factory=dict)
    scoped: bool = False
    ignored: str = ""
    group: str = "training"
    neutral: tuple = ()
    name: str = ""

    def used_by(self, spec) -> bool:
        """Whether the algorithm ``spec`` (its definition) takes this option."""
        return not self.scoped or self.name in spec.options



def option(default: Any, help: str, *, check=None, flag: str | None = "", scoped: bool = False, ignored: str = "",
           group: str = "training", neutral: tuple = (), **cli) -> Any:
    """A RunConfig field declared with its :class:`Option` (``flag=""``: ``--`` + the name with
    dashes; ``flag=None``: not on the command line)."""
    declared = Option(default, help, check, flag, cli, scoped, ignored, group, neutral)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"option": declared})
    return field(default=default, metadata={"option": declared})


# -- checks: each raises ConfigError with one line naming the option ------------------------
def integer_check(minimum: int, maximum: int | None = None, note: str = ""):
    def check(name: str, value) -> None:
        integer(name, value, minimum, error=ConfigError)
        if maximum is not None and value > maximum:
            raise ConfigError(f"{name} must be an integer in {minimum}..{maximum}{note}; got {value!r}")
    return check


def number_check(ok: Callable[[float], bool], allowed: str, optional: bool = False):
    def check(name: str, value) -> None:
        if optional and value is None:
            return
        if not finite_number(value) or not ok(value):
            raise ConfigError(f"{name} must be a number {allowed}; got {value!r}")
    return check


def boolean_check(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false; got {value!r}")


def string_check(name: str, value) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string; got {type(value).__name__} {value!r}"
                          + (" (pass str(path))" if hasattr(value, "__fspath__") else ""))


def one_of(choices: Callable[[], Any]):
    def check(name: str, value) -> None:
        string_check(name, value)
        if value not in choices():
            raise ConfigError(f"{name} must be one of {', '.join(choices())}; got {value!r}")
    return check


def optional_integer_check(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{name} must be an integer or None; got {value!r}")


def dict_check(name: str, value) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a dict; got {type(value).__name__}")
