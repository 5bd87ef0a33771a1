"""Checkpoints that stay valid whatever happens mid-write.

Layout under the run directory::

    checkpoint/step-000040/rank0.pt ... rankN.pt   one file per rank (torch.save of tensors)
    checkpoint/latest.json                          {"step": 40, "ranks": N}, written last

Every rank writes its file to a temporary name and renames it; after a barrier rank 0 replaces
``latest.json`` atomically and only then deletes older step directories. A crash at any point
leaves ``latest.json`` naming a complete set. Synchronous algorithms call :func:`save`
collectively at the same step on every rank.

Master-based (asynchronous) algorithms have no common step: every rank saves its own state when
it is due (:func:`save_own`: ``checkpoint/async/rankN.pt``, replaced atomically) and resumes
from it (:func:`load_own`). The ranks' files come from different moments, as the ranks do in an
asynchronous run; a resumed asynchronous run continues, it does not repeat bit for bit.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from mpi4py import MPI


def save(run_dir: Path, step: int, state: dict, comm: MPI.Comm) -> None:
    """Write this rank's ``state`` for ``step`` (collective over ``comm``)."""
    root = Path(run_dir) / "checkpoint"
    folder = root / f"step-{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    rank = comm.Get_rank()
    tmp = folder / f"rank{rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / f"rank{rank}.pt")
    comm.Barrier()  # every rank's file exists before the manifest names the step
    if rank == 0:
        manifest = root / "latest.json"
        tmp_manifest = root / "latest.json.tmp"
        tmp_manifest.write_text(json.dumps({"step": step, "ranks": comm.Get_size()}))
        os.replace(tmp_manifest, manifest)
        for old in root.glob("step-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    comm.Barrier()


def latest_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    manifest = Path(run_dir) / "checkpoint" / "latest.json"
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text())["step"]


def load(run_dir: Path, rank: int, nranks: int) -> dict:
    """This rank's state from the newest complete checkpoint of ``run_dir``."""
    manifest = Path(run_dir) / "checkpoint" / "latest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint/latest.json (was the run "
                                f"started with checkpoint_every > 0?)")
    info = json.loads(manifest.read_text())
    if info["ranks"] != nranks:
        raise ValueError(f"--resume {run_dir}: checkpoint has {info['ranks']} ranks, this run "
                         f"{nranks}")
    return torch.load(Path(run_dir) / "checkpoint" / f"step-{info['step']:06d}" / f"rank{rank}.pt")


def save_own(run_dir: Path, rank: int, nranks: int, state: dict) -> None:
    """Write one rank's state on its own (no collective): asynchronous algorithms."""
    folder = Path(run_dir) / "checkpoint" / "async"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"rank{rank}.pt.tmp"
    torch.save({**state, "ranks": nranks}, tmp)
    os.replace(tmp, folder / f"rank{rank}.pt")


def load_own(run_dir: Path, rank: int, nranks: int) -> dict | None:
    """This rank's own newest state, or None when it never saved one (it starts afresh)."""
    folder = Path(run_dir) / "checkpoint" / "async"
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint/async/ (was the run started with "
                                f"checkpoint_every > 0?)")
    path = folder / f"rank{rank}.pt"
    if not path.exists():
        return None
    state = torch.load(path)
    if state["ranks"] != nranks:
        raise ValueError(f"--resume {run_dir}: checkpoint has {state['ranks']} ranks, this run {nranks}")
    return state
