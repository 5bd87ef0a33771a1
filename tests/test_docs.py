"""The project's own documents are in the repository, and what cites them finds them.

The design notes once lived outside the repository (``DESIGN`` and ``PAPERS``, markdown files in a
shared folder); ``docs/architecture.md`` and ``docs/papers.md`` replace them. No file may cite the
old ones (but those two pages, which say what they replace), and every citation of a page under
``docs/`` with a section name (``docs/papers.md, "3. GradientFlow"``) names a page and a heading
that exist.
"""
from __future__ import annotations

import re
import subprocess
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
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" not in target:
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
