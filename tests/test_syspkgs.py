"""Every make target installs the Debian packages that what it runs uses, and every Debian file or
program that the project names belongs to a package that ``workbench/syspkgs.py`` declares (or to
one that every Debian system has). ``make demo`` once failed on a fresh machine because only
``make test`` installed Fashion-MNIST: these tests fail on that Makefile.

What a target runs is read from ``make -n TARGET`` (the commands make would run): the modules
(``-m``), files and folders named there, the notebooks those name, and for pytest the files it
collects with the same arguments. What a package is used by is its ``uses`` words.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workbench.syspkgs import BOOTSTRAP, PACKAGES, missing

ROOT = Path(__file__).resolve().parent.parent
#: targets that run nothing that needs a package of their own
NEEDS_NOTHING = {"clean": "removes the venv", "slurm-down": "stops what slurm-up started, which installed them",
                 "venv": "pip only"}
#: the programs' folders of a Debian system, searched for a program named by the code
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _dry_run(target: str) -> list[str]:
    out = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.replace("\\\n", " ").splitlines()  # a recipe's continued lines as one


def _phony_targets() -> list[str]:
    out = subprocess.run(["make", "-pRrq", "-f", "Makefile", ":"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    phony = next(line for line in out.splitlines() if line.startswith(".PHONY:"))
    return phony.split(":", 1)[1].split()


def _installed_by(lines: list[str]) -> set[str]:
    """The packages that the syspkgs install commands among ``lines`` install."""
    found = set()
    for line in lines:
        words = shlex.split(line)
        if any(w.endswith("syspkgs.py") for w in words) and "install" in words:
            rest = words[words.index("install") + 1:]
            skip = False
            for word in rest:
                if skip:
                    skip = False
                elif word in ("--for", "--optional"):
                    skip = True
                else:
                    found.add(word)
    return found


def _module_file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def _collected(pytest_args: list[str]) -> set[Path]:
    """The test files pytest collects with ``pytest_args`` (and the conftest it loads)."""
    keep = [a for a in pytest_args if not a.startswith("--nbval")]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *keep],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    files = {ROOT / line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    return files | {ROOT / "tests" / "conftest.py"}


def _text(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return path.read_text(encoding="utf-8", errors="replace")


def _what_it_runs(lines: list[str]) -> tuple[str, set[Path]]:
    """The command lines that are not package installs, and the files they run."""
    commands, files = [], set()
    for line in lines:
        words = shlex.split(line)
        if not words or any(w.endswith("syspkgs.py") for w in words):
            continue
        commands.append(line)
        if "-m" in words and words.index("-m") + 1 < len(words):
            module = words[words.index("-m") + 1]
            if module == "pytest":
                files |= _collected(words[words.index("-m") + 2:])
            elif (found := _module_file(module)) is not None:
                files.add(found)
        for word in words:
            path = ROOT / word if not os.path.isabs(word) else Path(word)
            if word and not word.startswith("-") and ROOT in path.resolve().parents and path.exists():
                files |= set(path.rglob("*.py")) | set(path.rglob("*.ipynb")) if path.is_dir() else {path}
    # the notebooks those files name (make demo's module runs notebook 01)
    for path in list(files):
        if path.suffix == ".py":
            files |= {ROOT / n for n in re.findall(r"notebooks/[\w.-]+\.ipynb", _text(path)) if (ROOT / n).exists()}
    return "\n".join(commands), files


def _uses(text: str) -> set[str]:
    return {name for name, package in PACKAGES.items() if any(word in text for word in package.uses)}


@pytest.mark.parametrize("target", [t for t in _phony_targets() if t not in NEEDS_NOTHING])
def test_each_target_installs_the_packages_that_what_it_runs_uses(target):
    lines = _dry_run(target)
    commands, files = _what_it_runs(lines)
    needed = {}
    for source, text in [(f"the command {commands!r}", commands),
                         *((str(p.relative_to(ROOT)), _text(p)) for p in sorted(files))]:
        for name in _uses(text):
            needed.setdefault(name, source)
    not_installed = {name: where for name, where in needed.items() if name not in _installed_by(lines)}
    assert not not_installed, (f"make {target} uses Debian packages that it does not install first: "
                               + "; ".join(f"{n} (used by {w})" for n, w in sorted(not_installed.items())))


def test_the_check_sees_a_target_that_runs_what_it_does_not_install():
    """The rule above, on lines like make demo's before the fix: the notebook needs the data set."""
    lines = [".venv/bin/python -m workbench.demo"]
    commands, files = _what_it_runs(lines)
    assert ROOT / "notebooks" / "01_quickstart.ipynb" in files
    used = set().union(*(_uses(_text(p)) for p in files))
    assert "dataset-fashion-mnist" in used and not _installed_by(lines)
    assert _installed_by(['python3 workbench/syspkgs.py install --for "make demo" --optional "x y" a b']) == {"a", "b"}


def test_every_install_line_of_the_makefile_names_declared_packages_only():
    everything = set()
    for target in _phony_targets():
        everything |= _installed_by(_dry_run(target))
    assert everything and everything <= set(PACKAGES), sorted(everything - set(PACKAGES))
    assert everything == set(PACKAGES), f"declared but installed by no target: {sorted(set(PACKAGES) - everything)}"


# --- every Debian file or program that the project names is declared ----------------------------

#: an absolute path into the system's programs and shared files
_SYSTEM_FILE = re.compile(r"(?<![\w./-])/(?:usr/(?:s?bin|share|lib|libexec)|s?bin)/[\w.+-][\w.+/-]*")
_PROGRAM = re.compile(r"[a-z][\w.+-]*\Z")


def _project_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith((".py", ".ipynb", ".sh")) or f in ("Makefile", ".ci/run")]


def _programs_run(source: str) -> set[str]:
    """Names of programs that Python code runs: the first item of a list or tuple of strings that
    is passed to a call, and the argument of ``which``/``tool``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if called in ("which", "tool") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(node.args[0].value)
        for arg in node.args[:1]:
            if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts and isinstance(arg.elts[0], ast.Constant):
                names.add(arg.elts[0].value)
    return {n for n in names if isinstance(n, str) and _PROGRAM.match(n)}


def _debian_package(path: str) -> str | None:
    """The Debian package that owns ``path`` (through /usr-merged links too), None if none does."""
    for candidate in dict.fromkeys([path, os.path.realpath(path), path.replace("/usr/", "/", 1)]):
        out = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        owners = [line for line in out.stdout.splitlines() if not line.startswith("diversion by")]
        if out.returncode == 0 and owners:
            return owners[0].split(":")[0].split(",")[0].strip()
    return None


def _priority(package: str) -> str:
    return subprocess.run(["dpkg-query", "-W", "-f", "${Priority}", package], capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def referenced() -> dict[str, str]:
    """Every system file or program the project names -> where (the first file that names it)."""
    found: dict[str, str] = {}
    for path in _project_files():
        text = _text(path)
        where = str(path.relative_to(ROOT))
        for file in _SYSTEM_FILE.findall(text):
            found.setdefault(file.rstrip("."), where)
        if path.suffix in (".py", ".ipynb"):
            for name in _programs_run(text):
                program = shutil.which(name, path=SYSTEM_PATH)
                if program and not program.startswith("/usr/local/"):
                    found.setdefault(program, where)
    return found


def test_every_debian_file_the_project_names_is_declared(referenced):
    assert shutil.which("dpkg-query"), "this check reads Debian's package database"
    assert not missing(PACKAGES), f"make test installs every declared package first; missing: {missing(PACKAGES)}"
    undeclared, unknown = {}, {}
    for path, where in sorted(referenced.items()):
        if not os.path.exists(path):
            # a folder a package makes (the data set's), or a file that is nowhere here
            if not any(f.startswith(path.rstrip("/") + "/") for p in PACKAGES.values() for f in p.files):
                unknown[path] = where
            continue
        package = _debian_package(path)
        if package is None or package in PACKAGES or package in BOOTSTRAP or _priority(package) in ("required", "important"):
            continue
        undeclared.setdefault(package, f"{path} in {where}")
    assert not unknown, f"files named that are not on this machine and no declared package makes: {unknown}"
    assert not undeclared, ("Debian packages used but not declared in workbench/syspkgs.py (so no make target "
                            f"installs them): {undeclared}")


def test_the_scan_finds_programs_run_from_python():
    code = ('subprocess.run(["ip", "-n", ns, "link"])\nshutil.which("srun")\ntool("tc")\n'
            'Popen(("sbatch", "--wrap", x))\nprint(["predict", 1])\nf(["not a program"])\n')
    assert _programs_run(code) == {"ip", "srun", "tc", "sbatch", "predict"}
    assert "/usr/share/datasets/fashion-mnist" in _SYSTEM_FILE.findall('P = Path("/usr/share/datasets/fashion-mnist")')


def test_each_declared_package_owns_its_files_and_says_whether_every_system_has_it():
    for name, package in PACKAGES.items():
        for file in package.files:
            assert _debian_package(file) == name, f"{file} is not {name}'s"
        assert (_priority(name) in ("required", "important")) == package.base, name


def test_the_fresh_list_is_what_ci_removes():
    out = subprocess.run([sys.executable, "workbench/syspkgs.py", "fresh"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [n for n, p in PACKAGES.items() if not p.base]
    assert "syspkgs.py fresh" in (ROOT / ".ci" / "run").read_text()


NOBODY = 65534
_AS_A_USER = """
import sys
sys.path.insert(0, sys.argv[1])
import syspkgs
syspkgs.PACKAGES["absent-package"] = syspkgs.Package("a test's", (sys.argv[1] + "/nothing",), ())
sys.exit(syspkgs.main(sys.argv[2:]))
"""


def test_a_user_who_cannot_install_gets_one_line_naming_the_packages():
    """As ``nobody`` (not root, no password-less sudo): one line, exit 2; with --optional, 0 and
    what goes on without them. The package is declared by the test, its file absent."""
    folder = Path(tempfile.mkdtemp(prefix="wbtest-syspkgs-"))
    try:
        folder.chmod(0o755)
        shutil.copy(ROOT / "workbench" / "syspkgs.py", folder / "syspkgs.py")
        python = "/usr/bin/python3"  # root's interpreter lives under /root, which nobody cannot enter

        def as_nobody(*args):
            return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
                                   "-c", _AS_A_USER, str(folder), *args], capture_output=True, text=True, timeout=60)
        refused = as_nobody("install", "--for", "make demo", "absent-package")
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and refused.stderr.startswith(
            "make demo: Debian's absent-package missing and not installable here (not root, no password-less sudo)")
        assert "`sudo apt-get install absent-package`" in refused.stderr
        going_on = as_nobody("install", "--for", "make demo", "--optional", "going on without it", "absent-package")
        assert going_on.returncode == 0 and going_on.stderr.rstrip().endswith("; going on without it")
        undeclared = as_nobody("install", "no-such-declaration")
        assert undeclared.returncode == 2 and "not declared in workbench/syspkgs.py" in undeclared.stderr
        here = as_nobody("install", "--for", "make demo", *PACKAGES)  # all here: nothing to do, nothing said
        assert (here.returncode, here.stdout, here.stderr) == (0, "", "")
    finally:
        shutil.rmtree(folder)
