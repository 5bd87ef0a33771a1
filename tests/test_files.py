"""workbench.files: the one atomic write, on a real file system."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.files import atomic_path, atomic_write


def test_text_and_bytes_replace_the_file_whole(tmp_path):
    path = tmp_path / "record.json"
    atomic_write(path, json.dumps({"step": 1}))
    assert json.loads(path.read_text()) == {"step": 1}
    atomic_write(str(path), b"\x00\xffbytes")
    assert path.read_bytes() == b"\x00\xffbytes"
    atomic_write(path, "λ")
    assert path.read_bytes() == "λ".encode("utf-8")
    assert os.listdir(tmp_path) == ["record.json"]   # no temporary file left


def test_a_block_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rank0.pt"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="half-way"):
        with atomic_path(path) as tmp:
            assert os.path.dirname(tmp) == str(tmp_path) and tmp != str(path)
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("half-way")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["rank0.pt"]
    with pytest.raises(FileNotFoundError):
        with atomic_path(path):   # a block that wrote nothing: nothing replaces the file
            pass
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["rank0.pt"]


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "latest.json"
    path.write_text('{"step": 1}')
    script = ("import os, sys\nsys.path.insert(0, sys.argv[2])\nfrom workbench.files import atomic_path\n"
              "with atomic_path(sys.argv[1]) as tmp:\n    open(tmp, 'w').write('{\"st')\n    os._exit(9)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert subprocess.run([sys.executable, "-c", script, str(path), root], timeout=60).returncode == 9
    assert json.loads(path.read_text()) == {"step": 1}   # a reader never sees half a file
    left = [n for n in os.listdir(tmp_path) if n != "latest.json"]
    assert len(left) == 1 and left[0].startswith(".latest.json.") and left[0].endswith(".tmp")  # hidden


def test_the_rank_guard_writes_its_records_with_it(tmp_path):
    from workbench.runtime.launch.mpiexec import GUARD
    done = subprocess.run([sys.executable, "-I", str(GUARD), str(tmp_path), sys.executable, "-c", "raise SystemExit(3)"],
                          timeout=60)
    assert done.returncode == 3
    (start,), (end,) = tmp_path.glob("*.start"), tmp_path.glob("*.status")
    assert json.loads(end.read_text())["exit_code"] == 3 and "guard_pid" in json.loads(start.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([start.name, end.name])
