"""The project's own documents are in the repository, and what cites them finds them.

The design notes once lived outside the repository (``DESIGN`` and ``PAPERS``, markdown files in a
shared folder); ``docs/architecture.md`` and ``docs/papers.md`` replace them. No file may cite the
old ones (but those two pages, which say what they replace), and every citation of a page under
``docs/`` with a section name (``docs/papers.md, "3. GradientFlow"``) names a page and a heading
that exist.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD = ("DESIGN" + ".md", "PAPERS" + ".md")  # spelt in two parts, so this file does not cite them
HISTORY = {"docs/architecture.md", "docs/papers.md"}  # they name what they replace
TEXT = {".py", ".md", ".ipynb", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".json"}
SKIP = (".git/", ".venv/", "data/", "benchmarks/results/")
#: ``docs/NAME.md`` then, in the same sentence, the section: `, "Heading"` (quotes escaped in notebooks)
CITATION = re.compile(r'docs/([\w-]+)\.md`?\)?,? \(?\\?"([^"\\]+)\\?"')


def _files() -> list[str]:
    """The repository's text files: tracked and new ones (git's view), else a walk of the tree."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    return sorted(f for f in listed if Path(f).suffix in TEXT or Path(f).name in ("Makefile",)
                  if not f.startswith(SKIP) and (ROOT / f).is_file())


def _headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]


def test_nothing_cites_the_design_notes_that_lived_outside_the_repository():
    offenders = [f"{f}:{n}" for f in _files() if f not in HISTORY
                 for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1)
                 if any(old in line for old in OLD)]
    assert not offenders, f"cite docs/architecture.md or docs/papers.md instead: {offenders}"


def test_every_cited_section_of_the_docs_exists():
    cited = [(f, page, section) for f in _files()
             for page, section in CITATION.findall((ROOT / f).read_text(errors="replace"))]
    assert cited, "no citation found: the pattern no longer matches how the docs are cited"
    missing = [f"{f}: docs/{page}.md, {section!r}" for f, page, section in cited
               if not (ROOT / "docs" / f"{page}.md").exists()
               or not any(h.startswith(section) for h in _headings(ROOT / "docs" / f"{page}.md"))]
    assert not missing, f"no such page or heading: {missing}"


def test_the_pages_link_to_files_that_exist():
    """Each link of a page under docs/ is to a file that exists, or to a page the site generates."""
    generated = re.search(r"GENERATED = \(([^)]*)\)", (ROOT / "tools" / "docs.py").read_text()).group(1)
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" not in target and f'"{target}"' not in generated:
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_benchmark_records_the_machine_and_its_load():
    """Each script under benchmarks/ that writes JSON records ``machine`` and ``load_average`` through the
    one helper, :mod:`workbench.bench.machine` (read statically: the scripts take minutes to run)."""
    from workbench.bench.machine import Load, describe
    assert set(describe()) == {"host", "cpus", "system", "python"}
    assert set(Load().done()) == {"before", "after"}
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if "json.dump" in p.read_text()]
    assert scripts
    needed = ("workbench.bench.machine", "describe()", "Load()", "load_average")
    missing = [p.name for p in scripts if not all(s in p.read_text() for s in needed)]
    assert not missing, f"record machine=describe() and load_average=Load().done() in {missing}"
    # `workbench bench allreduce --json` (make bench) writes its JSON from the package
    assert "describe()" in (ROOT / "workbench" / "bench" / "allreduce.py").read_text()


def test_the_readme_is_a_front_door_whose_links_lead_somewhere():
    """Issue 47: the README says what this is, how to start and where to read more, in under 200 lines; each of
    its links is to a file of the repository that exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200, len(text.splitlines())
    for section in ("## Two commands", "## A first run", "## What is inside", "## Notebooks", "## Documentation",
                    "## License"):
        assert section in text, section
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_site_links_each_page_to_the_sites_copy_and_names_other_files():
    """tools/docs.py rewrites a page's links for the site: to the site's copy of a page, the results, the changelog
    or a notebook; any other file of the repository becomes its path in code type (the site has no copy)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_tool", ROOT / "tools" / "docs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = ("[a](docs/faults.md#under-slurm) [b](benchmarks/README.md) [c](notebooks/09_a_lost_node.ipynb) "
            "[d](workbench/config.py) [e](https://example.org/x) [f](CHANGELOG.md)")
    assert tool.relink(text, "README.md", "index.md") == (
        "[a](faults.md#under-slurm) [b](results.md) [c](notebooks/09_a_lost_node.ipynb) d (`workbench/config.py`) "
        "[e](https://example.org/x) [f](changelog.md)")
    assert tool.relink("[r](../benchmarks/README.md#a-lost-node) [p](papers.md)", "docs/faults.md", "faults.md") == \
        "[r](results.md#a-lost-node) [p](papers.md)"
    assert tool.relink("[q](../README.md)", "notebooks/README.md", "notebooks/index.md") == "[q](../index.md)"
    # a notebook's embedded plotly.js (5 MB) becomes the site's one copy, loaded where the bundle was
    bundle = '<script type="text/javascript">/**\n* plotly.js v3.1.0\n*/ window.Plotly = {};</script>'
    figure = '<div id="f"></div><script>Plotly.newPlot("f", [])</script>'
    notebook = {"cells": [{"cell_type": "code", "outputs": [{"data": {"text/html": [bundle, figure]}}]},
                          {"cell_type": "code", "outputs": [{"data": {"text/html": figure}}, {"text": "x"}]}]}
    linked = json.loads(tool.plotlyjs_linked(json.dumps(notebook)))
    script = '<script type="text/javascript" src="../assets/plotly.min.js"></script>'
    assert linked["cells"][0]["outputs"][0]["data"]["text/html"] == script + figure
    assert linked["cells"][1] == notebook["cells"][1]
    # a figure shown as plotly's own output type (fig.show()) gets an HTML form that draws it, plotly.js first
    shown = {"cells": [{"cell_type": "code", "outputs": [{"data": {tool.PLOTLY_MIME: {
        "data": [{"type": "scatter", "x": [1, 2], "y": [3, 4], "name": "loss"}], "layout": {}}}}] * 2}]}
    first, second = (o["data"]["text/html"] for o in json.loads(tool.plotlyjs_linked(json.dumps(shown)))["cells"][0]["outputs"])
    assert first.startswith(script) and "Plotly.newPlot" in first and '"loss"' in first
    assert "Plotly.newPlot" in second and script not in second  # plotly.js once a page
    reference = tool.cli_reference()
    assert "## workbench train" in reference and "--max-restarts" in reference and "### workbench vcluster up" in reference
    from workbench.optim.registry import ALGORITHMS
    rows = [line for line in tool.algorithms_reference().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(ALGORITHMS)  # one row each, from the definitions


#: run in a process of its own (it imports every module a docstring names, mpi4py's MPI among them)
XREF = """
import importlib, pathlib, re, sys
bad = set()
for path in sorted(pathlib.Path("workbench").rglob("*.py")):
    for name in re.findall(r":(?:func|class|mod|meth|data|attr):`~?(workbench(?:\\.\\w+)+)`", path.read_text()):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attribute in parts[i:]:
                    obj = getattr(obj, attribute)
            except AttributeError:
                bad.add(f"{path}: {name}")
            break
print("\\n".join(sorted(bad)))
"""


def test_every_cross_reference_in_a_docstring_names_something_that_exists():
    """Issue 47: ``:func:`~workbench.x.y``` in a docstring names a module, class or function that is there (the
    API reference renders them; a name moved to another module left stale references behind)."""
    done = subprocess.run([sys.executable, "-c", XREF], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"stale references:\n{done.stdout}"
