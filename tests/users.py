"""Running the project's own Python as another Linux user, for tests run as root: ``nobody`` or a user
made for the test (``useradd``, a ``wbsec`` name, removed after).

The test machine's Python may sit under a folder only root may pass (pyenv in /root): in a private
mount namespace of each call, such a folder is covered by one that lets anyone pass, holding just the
entries the command needs. The user runs with no capabilities and only its own groups."""
from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534


def _blocking(paths) -> dict[str, set[str]]:
    """Folders another user cannot pass on the way to ``paths`` (the venv's interpreter may live under a
    0700 home), with the entries of each that must stay reachable."""
    out: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for i in range(1, len(parts)):
            folder = Path(*parts[:i])
            if not os.stat(folder).st_mode & 0o001:
                out.setdefault(str(folder), set()).add(parts[i])
                break
    return out


def as_user_argv(uid: int, gid: int, argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` as ``uid``/``gid`` (see the module's docstring)."""
    steps = []
    for i, (folder, entries) in enumerate(_blocking([sys.executable, sys.prefix, str(ROOT / "workbench")]).items()):
        stash = f"/run/wbtest-stash-{os.getpid()}-{secrets.token_hex(3)}-{i}"
        steps += [f"mkdir -p {stash}", f"mount --bind '{folder}' {stash}",
                  f"mount -t tmpfs -o mode=0711 wbtest '{folder}'"]
        for entry in entries:
            steps += [f"mkdir -p '{folder}/{entry}'", f"mount --rbind '{stash}/{entry}' '{folder}/{entry}'"]
        steps += [f"umount -l {stash}", f"rmdir {stash}"]
    script = "; ".join(steps + [f'exec setpriv --reuid={uid} --regid={gid} --clear-groups "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


def as_user(uid: int, gid: int, argv: list[str], env: dict, timeout: float = 120,
            cwd: str = "/") -> subprocess.CompletedProcess:
    return subprocess.run(as_user_argv(uid, gid, argv), capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)


@contextlib.contextmanager
def made_user(tag: str):
    """A Linux user made for the test, ``wbsec<tag><random>``, with a 0700 home; removed after, with
    everything it owns and every process it left."""
    name = f"wbsec{tag}{secrets.token_hex(3)}"
    home = Path("/var/tmp") / name
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, capture_output=True)
    try:
        import pwd
        entry = pwd.getpwnam(name)
        home.mkdir(mode=0o700)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        yield entry
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["rm", "-rf", str(home)], capture_output=True)
