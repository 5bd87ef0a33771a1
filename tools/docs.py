"""The documentation site: ``docs/`` and its neighbours assembled into ``build/docs-src/``, then built by MkDocs
(``mkdocs.yml``) into ``site/`` with warnings as errors.

    python tools/docs.py build     # make docs
    python tools/docs.py serve     # make docs-serve: http://127.0.0.1:8000, rebuilt on change

Why assembled: the pages are read on the repository too, where they link to files beside them
(``../benchmarks/README.md``, ``notebooks/01_quickstart.ipynb``); the site holds copies of those (the
measured results, the changelog, the executed notebooks), so each link is rewritten to the copy, and a link to
any other file of the repository (code, JSON) becomes its path in code type. What the site adds that is not
written by hand is generated here: the command-line reference from the parser, the Python API reference
page (mkdocstrings reads the docstrings), and the notebooks as the test run executed them
(``build/notebooks/``, written by ``tests/test_notebooks.py``; one that is missing is executed first).

MkDocs with Material, mkdocs-jupyter and mkdocstrings rather than Sphinx with MyST-NB: the pages are
Markdown already (GitHub-flavoured, read on the repository as well), ``mkdocs build --strict`` fails on a
link to a page or an anchor that does not exist, mkdocs-jupyter shows an executed notebook as it is (no
execution at build time), and the whole toolchain is pip packages pinned in ``constraints.txt`` (no download
at build time). Material for MkDocs is maintained until May 2027 (its banner says so); its successor, Zensical,
reads the same ``mkdocs.yml``. Standard library here; MkDocs runs as a subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the workbench of this checkout: the references are generated from it
SOURCE = ROOT / "build" / "docs-src"
EXECUTED = ROOT / "build" / "notebooks"  # the notebooks as tests/test_notebooks.py executed them
#: files of the repository that the site holds a copy of: repository path -> site path
COPIES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md", "benchmarks/README.md": "results.md",
          "notebooks/README.md": "notebooks/index.md"}
#: the pages the site generates (docs/ may link to them; they exist on the site only)
GENERATED = ("cli-reference.md", "api.md", "algorithms.md")
LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")
#: the API reference: the objects a user imports, by page section
API = {
    "Runs": ["workbench.config.RunConfig", "workbench.runtime.client.cluster.Cluster", "workbench.runtime.client.run.Run",
             "workbench.results.RunResult", "workbench.store.Store", "workbench.sweep.Sweep"],
    "Dashboards": ["workbench.dashboard.Dashboard"],
    "Virtual cluster": ["workbench.vcluster.cluster.VirtualCluster"],
    "Collectives": ["workbench.schedules.schedule.Schedule", "workbench.schedules.schedule.Transfer"],
    "Algorithms of your own": ["workbench.optim.definition.Algorithm", "workbench.optim.definition.LockStep", "workbench.optim.definition.Periodic",
                               "workbench.optim.definition.MasterBased"],
    "Summaries": ["workbench.summary.Summary"],
}
#: the API objects whose inherited members the page shows too (their public methods live in mixins and bases)
INHERITED = {"workbench.runtime.client.run.Run", "workbench.store.Store", "workbench.vcluster.cluster.VirtualCluster"}


def site_path(repo_path: str) -> str | None:
    """Where a file of the repository is on the site, or None when the site has no copy of it."""
    if repo_path in COPIES:
        return COPIES[repo_path]
    if repo_path.startswith("docs/") and ((ROOT / repo_path).is_file() or repo_path[5:] in GENERATED):
        return repo_path.removeprefix("docs/")
    if re.fullmatch(r"notebooks/\d\d_\w+\.ipynb", repo_path):
        return repo_path
    return None


def relink(text: str, repo_path: str, site: str) -> str:
    """``text`` of the file at ``repo_path`` (shown at ``site``) with each relative link pointing at the site's
    copy of its target; a target the site has no copy of becomes its repository path in code type."""
    here = Path(repo_path).parent

    def one(match: re.Match) -> str:
        label, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(here / path).replace(os.sep, "/")
        copy = site_path(resolved)
        if copy is None:
            return f"{label.lstrip('!')[1:-1]} (`{resolved}`)" if label.strip("[]!") != f"`{resolved}`" else label
        relative = os.path.relpath(copy, Path(site).parent).replace(os.sep, "/")
        return f"{label}({relative}{'#' + anchor if anchor else ''})"

    return LINK.sub(one, text)


def cli_reference() -> str:
    """Every ``workbench`` command's help, as the parser prints it."""
    from workbench.cli import build_parser
    parser = build_parser()
    out = ["# Command-line reference", "", "Generated from the parser (`workbench COMMAND --help`).", "",
           "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._subparsers._group_actions:  # noqa: SLF001 - argparse keeps its subparsers there
        for name, sub in action.choices.items():
            out += [f"## workbench {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
            nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
            for group in nested:
                for inner, subsub in group.choices.items():
                    out += [f"### workbench {name} {inner}", "", "```text", subsub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def api_reference() -> str:
    """The API page: mkdocstrings renders each object from its docstring."""
    out = ["# Python API reference", "", "Generated from the docstrings. `import workbench as wb` gives the names a "
           "notebook uses (`wb.RunConfig`, `wb.Cluster`, `wb.Dashboard`, `wb.Store`, `wb.Sweep`, `wb.VirtualCluster`).", ""]
    for section, names in API.items():
        out += [f"## {section}", ""]
        for name in names:
            out.append(f"::: {name}\n" + ("    options:\n      inherited_members: true\n" if name in INHERITED else ""))
            if name == "workbench.config.RunConfig":
                out += options_table()  # its fields, right below it
    return "\n".join(out)


def options_table() -> list[str]:
    """Every field of ``RunConfig``, as it is declared (``workbench/options.py``): its default and what it is."""
    from workbench.cli import build_parser
    from workbench.config import options
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions).choices["train"]  # noqa: SLF001
    flags = {a.dest for a in train._actions}  # noqa: SLF001
    rows = ["### RunConfig's fields", "", "Each is also a `workbench train` option (`--name-with-dashes`) unless "
            "marked; an algorithm that does not use one refuses it in one line.", "",
            "| field | default | what it is |", "|---|---|---|"]
    for name, declared in options().items():  # every RunConfig field, as declared
        text = " ".join(declared.help.split()).replace("|", "\\|")
        rows.append(f"| `{name}` | `{declared.default!r}` | {text}{'' if name in flags else ' (not on the command line)'} |")
    return rows + [""]


#: where each family's paper and its reproduction are told (docs/papers.md)
FAMILY_PAPER = {"lock-step": "papers.md#1-easgd-for-hpc-clusters-you-buluc-demmel-sc17",
                "master-based": "papers.md#1-easgd-for-hpc-clusters-you-buluc-demmel-sc17",
                "periodic": "papers.md#5-easgds-descendants-local-sgd-diloco-streaming-diloco-issue-25"}


def algorithms_reference() -> str:
    """The built-in training algorithms, from their definitions (``workbench/optim/registry.py``)."""
    from workbench.optim.definition import EXCHANGES
    from workbench.optim.registry import ALGORITHMS
    out = ["# The training algorithms", "", f"The {len(ALGORITHMS)} built-in algorithms, as their definitions in "
           "`workbench/optim/registry.py` declare them (`workbench algorithms` prints the same names). A "
           "*lock-step* algorithm exchanges on every rank at once (a collective), a *periodic* one after "
           "`sync_every` local steps, a *master-based* one through rank 0, which holds the weights or the "
           "center and serves the workers one exchange at a time. Your own: [own-algorithm.md](own-algorithm.md).",
           "", "| algorithm | family | what it does | what it sends | default lr, momentum | its own options | paper |",
           "|---|---|---|---|---|---|---|"]
    for a in ALGORITHMS.values():
        sends = EXCHANGES.get(a.exchange) or (
            "every tau steps, its weights to rank 0 and the center back" if "rho" in a.options else
            "every tau steps, its gradients to rank 0 and the master's weights back" if a.master_based else "-")
        options = ", ".join(f"`{o}`" for o in sorted(a.options)) or "-"
        paper = "descendants" if a.family == "periodic" else "SC'17"
        out.append(f"| `{a.name}` | {a.family} | {a.description} | {sends} | {a.default_lr:g}, "
                   f"{a.default_momentum:g} | {options} | [{paper}]({FAMILY_PAPER[a.family]}) |")
    return "\n".join(out + [""])


def executed_notebooks() -> list[Path]:
    """The notebooks as the test run executed them; those missing are executed now (the same test)."""
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [nb for nb in notebooks if not (EXECUTED / nb.name).exists()]
    if missing:
        print(f"docs: executing {len(missing)} notebook(s) the test run has not: "
              f"{', '.join(nb.stem for nb in missing)}", flush=True)
        ids = [f"tests/test_notebooks.py::test_the_notebook_runs[{nb.stem}]" for nb in missing]
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids], cwd=ROOT, check=True)
    return [EXECUTED / nb.name for nb in notebooks]


def assemble(with_notebooks: bool = True) -> None:
    """``build/docs-src/``: the pages, the copies (links rewritten), the generated pages and the notebooks."""
    shutil.rmtree(SOURCE, ignore_errors=True)
    SOURCE.mkdir(parents=True)
    for page in sorted((ROOT / "docs").rglob("*")):
        if page.is_file():
            repo = str(page.relative_to(ROOT))
            target = SOURCE / repo.removeprefix("docs/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if page.suffix == ".md":
                target.write_text(relink(page.read_text(), repo, repo.removeprefix("docs/")))
            else:
                shutil.copy2(page, target)
    for repo, site in COPIES.items():
        (SOURCE / site).parent.mkdir(parents=True, exist_ok=True)
        (SOURCE / site).write_text(relink((ROOT / repo).read_text(), repo, site))
    for name, make in zip(GENERATED, (cli_reference, api_reference, algorithms_reference)):
        (SOURCE / name).write_text(make())
    if with_notebooks:
        for notebook in executed_notebooks():
            (SOURCE / "notebooks" / notebook.name).write_text(plotlyjs_linked(notebook.read_text()))
        from plotly.offline import get_plotlyjs  # the bundle the notebooks embedded, from the same package
        (SOURCE / PLOTLYJS_FILE).parent.mkdir(parents=True, exist_ok=True)
        (SOURCE / PLOTLYJS_FILE).write_text(get_plotlyjs())


#: plotly.js on the site: one file, which every notebook page loads, instead of 5 MB embedded in each
PLOTLYJS_FILE = "assets/plotly.min.js"
#: the output type of a plotly figure shown with ``fig.show()`` in JupyterLab
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def plotlyjs_linked(notebook: str) -> str:
    """An executed notebook's JSON text as the site shows it: the plotly.js bundle it embeds (once:
    ``workbench.demo.slim``) replaced by a script that loads the site's copy (:data:`PLOTLYJS_FILE`), at the same
    place, so the figures after it find ``window.Plotly`` as before; and each figure a notebook showed as plotly's
    own output type alone (``fig.show()``: JupyterLab draws it, a static page cannot) given an HTML form that
    draws it, after that script (added before the first such figure when nothing loaded plotly.js earlier)."""
    import plotly.io
    from workbench.demo import PLOTLYJS
    data = json.loads(notebook)
    script = f'<script type="text/javascript" src="../{PLOTLYJS_FILE}"></script>'
    loaded = False
    for cell in data["cells"]:
        for output in cell.get("outputs", []):
            shown = output.get("data", {})
            if "text/html" in shown:
                html = "".join(shown["text/html"]) if isinstance(shown["text/html"], list) else shown["text/html"]
                linked = PLOTLYJS.sub(lambda _: script, html)
                loaded = loaded or linked != html
                shown["text/html"] = linked
            elif PLOTLY_MIME in shown:
                figure = plotly.io.to_html(shown[PLOTLY_MIME], include_plotlyjs=False, full_html=False)
                shown["text/html"] = ("" if loaded else script) + figure
                loaded = True
    return json.dumps(data, indent=1, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "serve", "assemble"])
    parser.add_argument("--no-notebooks", action="store_true", help="leave the notebooks out (a quick look)")
    args = parser.parse_args(argv)
    assemble(with_notebooks=not args.no_notebooks)
    if args.command == "assemble":
        return 0
    mkdocs = [sys.executable, "-m", "mkdocs"]
    os.environ["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its successor (see the module's text)
    if args.command == "serve":
        return subprocess.run([*mkdocs, "serve", "--dev-addr", "127.0.0.1:8000", "-f", str(ROOT / "mkdocs.yml")],
                              cwd=ROOT).returncode
    return subprocess.run([*mkdocs, "build", "--strict", "-f", str(ROOT / "mkdocs.yml")], cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())
