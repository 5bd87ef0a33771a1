"""A griffe extension for the API reference: the docstrings' Sphinx roles as links or code.

The docstrings cite code in Sphinx's roles (``:class:`~workbench.config.RunConfig```, ``:meth:`wait```), which
Markdown shows as they are written. mkdocstrings loads the package through griffe, which runs this extension
(``mkdocs.yml``, the python handler's ``extensions``) once the package is loaded, before any docstring is
rendered. Each role becomes a mkdocs-autorefs cross-reference, ``[`RunConfig`][workbench.config.RunConfig]``,
when its target is an object the API page renders (one of ``tools/docs.py``'s ``API`` or a public member of one
that has a docstring), and inline code otherwise, so ``mkdocs build --strict`` never meets a reference it cannot
resolve. The text shown is Sphinx's: the last component for ``~target``, the title of ``title <target>``, the
target as written otherwise. A target is looked up as Sphinx does: as written, then in the scopes around the
docstring (its class, its module), through imports to the object itself.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import griffe

#: ``:class:`...```, ``:py:meth:`...```, any of Python's roles: its body (``a.b``, ``~a.b``, ``!a.b``, ``title <a.b>``)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|const|exc|obj|mod):`(?P<body>[^`]+)`")


def api_names() -> tuple[list[str], set[str]]:
    """The objects the API page renders and those of them shown with their inherited members, from
    ``tools/docs.py``'s ``API`` and ``INHERITED`` (one list, that one)."""
    spec = importlib.util.spec_from_file_location("workbench_docs_tool", Path(__file__).with_name("docs.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return [name for names in tool.API.values() for name in names], set(tool.INHERITED)


def _lookup(collection: griffe.ModulesCollection, path: str) -> griffe.Object | None:
    """The object at dotted ``path``, through imports (aliases) to where it is defined; None if there is none."""
    try:
        found = collection[path]
        return found.final_target if found.is_alias else found
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _walk(obj: griffe.Object):
    """``obj`` and every object defined in it (imported names left out: they are documented where defined)."""
    yield obj
    for member in list(obj.members.values()):
        if not member.is_alias:
            yield from _walk(member)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a loaded package (see the module's text).

    Args:
        api: the dotted paths of the objects the API page renders; by default ``tools/docs.py``'s ``API``.
        inherited: those of them shown with their inherited members; by default ``tools/docs.py``'s
            ``INHERITED``.
    """

    def __init__(self, api: list[str] | None = None, inherited: list[str] | None = None) -> None:
        names, shown = api_names() if api is None or inherited is None else ([], set())
        self.api = list(api) if api is not None else names
        self.inherited = set(inherited) if inherited is not None else shown

    def rendered(self, collection: griffe.ModulesCollection) -> dict[str, str]:
        """Where each object with an anchor on the API page is defined -> its anchor: each API object and
        its public members with a docstring (``filters: ["!^_"]``, and mkdocstrings leaves out a member
        without one), inherited ones too for the objects in ``inherited`` (anchored under the class)."""
        anchors = {}
        for name in self.api:
            obj = _lookup(collection, name)
            if obj is None:
                continue
            anchors[obj.path] = obj.path
            members = dict(obj.inherited_members) if name in self.inherited and obj.is_class else {}
            members.update(obj.members)
            for member_name, member in members.items():
                try:
                    target = member.final_target if member.is_alias else member
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    continue
                if not member_name.startswith("_") and target.docstring and (member.inherited or not member.is_alias):
                    anchors.setdefault(target.path, f"{obj.path}.{member_name}")
        return anchors

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Once a package is loaded (the whole tree there, nothing rendered yet): rewrite its docstrings."""
        collection = loader.modules_collection
        rendered = self.rendered(collection)
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda match: self.reference(match["body"], obj, collection, rendered),
                                               obj.docstring.value)

    @staticmethod
    def reference(body: str, where: griffe.Object, collection: griffe.ModulesCollection,
                  rendered: dict[str, str]) -> str:
        """One role's body as Markdown: a cross-reference to what the page renders, else inline code."""
        body = " ".join(body.split())
        title, _, explicit = body.partition(" <")
        if explicit.endswith(">"):
            target, shown = explicit[:-1], title
        else:
            target = body
            shown = target.lstrip("~!.").rsplit(".", 1)[-1] if target.startswith("~") else target.lstrip("!.")
        if target.startswith("!"):
            return f"`{shown}`"
        target = target.lstrip("~.")
        scopes = [""] + [f"{scope.path}." for scope in (where, *_parents(where)) if scope.is_class or scope.is_module]
        for scope in scopes:
            found = _lookup(collection, scope + target)
            if found is not None:
                return f"[`{shown}`][{rendered[found.path]}]" if found.path in rendered else f"`{shown}`"
        return f"`{shown}`"


def _parents(obj: griffe.Object):
    while obj.parent is not None:
        obj = obj.parent
        yield obj
