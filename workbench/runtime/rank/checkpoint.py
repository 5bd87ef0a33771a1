"""Checkpoints that stay valid whatever happens mid-write.

Layout under the run directory::

    checkpoint/step-000040/rank0.pt ... rankN.pt   one file per rank (torch.save of tensors)
    checkpoint/latest.json                          {"step": 40, "ranks": N}, written last

Every rank writes its file atomically (:mod:`workbench.files`); after a barrier rank 0 replaces
``latest.json`` atomically and only then deletes older step directories. A crash at any point
leaves ``latest.json`` naming a complete set. Synchronous algorithms call :func:`save`
collectively at the same step on every rank.

Master-based (asynchronous) algorithms have no common step: every rank saves its own state when
it is due (:func:`save_own`: ``checkpoint/async/rankN.pt``, replaced atomically) and resumes
from it (:func:`load_own`). The ranks' files come from different moments, as the ranks do in an
asynchronous run; a resumed asynchronous run continues, it does not repeat bit for bit.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values
only, and a file planted in a run directory cannot run code when a run resumes from it.
:func:`check_resume` compares a run directory with a new configuration before anything launches.
torch and mpi4py are imported where they are used, so the CLI can check a resume without
initialising MPI.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ...files import atomic_path, atomic_write

if TYPE_CHECKING:
    from mpi4py import MPI

    from ...config import RunConfig


def save(run_dir: Path, step: int, state: dict, comm: MPI.Comm) -> None:
    """Write this rank's ``state`` for ``step`` (collective over ``comm``)."""
    root = Path(run_dir) / "checkpoint"
    folder = root / f"step-{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    import torch
    rank = comm.Get_rank()
    with atomic_path(folder / f"rank{rank}.pt") as tmp:
        torch.save(state, tmp)
    comm.Barrier()  # every rank's file exists before the manifest names the step
    if rank == 0:
        atomic_write(root / "latest.json", json.dumps({"step": step, "ranks": comm.Get_size()}))
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


def load(run_dir: Path, rank: int, nranks: int, resize: bool = False) -> dict:
    """This rank's state from the newest complete checkpoint of ``run_dir``. ``resize``: an elastic restart
    on another number of ranks (``RunConfig.min_ranks``) may load it; rank ``r`` takes the state of rank
    ``r`` modulo the checkpoint's ranks (the lock-step family's states are the same on every rank, but
    for what is each rank's own: a worker's EASGD weights, CSC's residual)."""
    manifest = Path(run_dir) / "checkpoint" / "latest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint/latest.json (was the run "
                                f"started with checkpoint_every > 0?)")
    info = json.loads(manifest.read_text())
    if info["ranks"] != nranks and not resize:
        raise ValueError(f"--resume {run_dir}: checkpoint has {info['ranks']} ranks, this run "
                         f"{nranks}")
    import torch
    return torch.load(Path(run_dir) / "checkpoint" / f"step-{info['step']:06d}" / f"rank{rank % info['ranks']}.pt",
                      weights_only=True)


def save_own(run_dir: Path, rank: int, nranks: int, state: dict) -> None:
    """Write one rank's state on its own (no collective): asynchronous algorithms."""
    folder = Path(run_dir) / "checkpoint" / "async"
    folder.mkdir(parents=True, exist_ok=True)
    import torch
    with atomic_path(folder / f"rank{rank}.pt") as tmp:
        torch.save({**state, "ranks": nranks}, tmp)


def load_own(run_dir: Path, rank: int, nranks: int, resize: bool = False) -> dict | None:
    """This rank's own newest state, or None when it never saved one (it starts afresh). ``resize``: an
    elastic restart on another number of ranks may load it (a rank beyond the ranks that saved takes a
    worker's state: the worker ``1 + (rank - 1) % (saved - 1)``)."""
    folder = Path(run_dir) / "checkpoint" / "async"
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint/async/ (was the run started with "
                                f"checkpoint_every > 0?)")
    path = folder / f"rank{rank}.pt"
    import torch
    if not path.exists():
        if not resize or rank == 0:
            return None
        saved = [int(p.stem[4:]) for p in folder.glob("rank*.pt") if p.stem[4:].isdigit() and p.stem != "rank0"]
        if not saved:
            return None
        path = folder / f"rank{1 + (rank - 1) % max(saved)}.pt"
        if not path.exists():
            return None
    state = torch.load(path, weights_only=True)
    if state["ranks"] != nranks and not resize:
        raise ValueError(f"--resume {run_dir}: checkpoint has {state['ranks']} ranks, this run {nranks}")
    return state


def marker(run_dir: str | os.PathLike, master_based: bool) -> Path:
    """What says that ``run_dir`` holds a checkpoint of the kind an algorithm writes: ``checkpoint/async/``
    (a master-based run: each rank's own) or ``checkpoint/latest.json`` (the lock-step family's manifest)."""
    root = Path(run_dir) / "checkpoint"
    return root / "async" if master_based else root / "latest.json"


#: What a resumed run must share with the run it continues: the weights' shapes and their meaning.
RESUME_FIELDS = ("algorithm", "model", "dataset", "ranks")


def check_resume(run_dir: str | os.PathLike, cfg: "RunConfig") -> None:
    """Refuse (:class:`~workbench.config.ConfigError`, one line) to resume ``cfg`` from
    ``run_dir`` unless it is a directory holding a checkpoint of the kind ``cfg``'s algorithm
    writes, from a run with the same algorithm, model, dataset and rank count (any rank count when
    ``cfg.min_ranks`` is set: an elastic run goes on at another size) (read from its
    ``config.json``, which must be there, and ``checkpoint/latest.json``). Reads JSON only: no
    torch, no MPI."""
    from ...config import ConfigError
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"resume: {str(run_dir)!r} is {'a file' if run_dir.exists() else 'missing'}; "
                          f"give the run directory to continue")
    differ = []
    config_file = run_dir / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"resume: {run_dir} has no config.json (every run writes one; without it the "
                          f"checkpoint's {', '.join(RESUME_FIELDS[:3])} cannot be checked): give a run directory")
    try:
        old = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"resume: cannot read {config_file}: {exc}") from None
    # an elastic run (min_ranks) goes on at another size: rank r takes the state of rank r modulo the saved ranks
    elastic = cfg.min_ranks is not None
    for name in RESUME_FIELDS:
        if name == "ranks" and elastic:
            continue
        mine, theirs = getattr(cfg, name), old.get(name)
        if name == "dataset" and str(mine).endswith(".npz") and isinstance(theirs, str):
            same = os.path.realpath(mine) == os.path.realpath(theirs)
        else:
            same = mine == theirs
        if not same:
            differ.append(f"{name} {theirs!r} (checkpoint) vs {mine!r} (this run)")
    if cfg.spec.master_based:
        if not marker(run_dir, True).is_dir():
            raise ConfigError(f"resume: {run_dir} has no checkpoint/async/ ({cfg.algorithm} saves one there; "
                              f"was the run started with checkpoint_every > 0, with a master-based algorithm?)"
                              + (f"; also differs: {'; '.join(differ)}" if differ else ""))
    else:
        manifest = marker(run_dir, False)
        if not manifest.is_file():
            raise ConfigError(f"resume: {run_dir} has no checkpoint/latest.json ({cfg.algorithm} saves one "
                              f"there; was the run started with checkpoint_every > 0, with a synchronous "
                              f"algorithm?)" + (f"; also differs: {'; '.join(differ)}" if differ else ""))
        try:
            info = json.loads(manifest.read_text())
            ranks, step = info["ranks"], info["step"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"resume: cannot read {manifest}: {type(exc).__name__}: {exc}") from None
        if ranks != cfg.ranks and not elastic and not any(d.startswith("ranks ") for d in differ):
            differ.append(f"ranks {ranks!r} (checkpoint) vs {cfg.ranks!r} (this run)")
    if differ:
        raise ConfigError(f"resume: {run_dir} is a checkpoint of another run: {'; '.join(differ)}")
    if not cfg.spec.master_based:
        _check_complete(run_dir, step, ranks)


def _check_complete(run_dir: Path, step, ranks: int) -> None:
    """ConfigError unless every rank's file of the checkpoint ``latest.json`` names is there and
    readable: :func:`load` reads them on the ranks, where a missing one would fail the job."""
    from ...config import ConfigError
    if not isinstance(step, int) or isinstance(step, bool):
        raise ConfigError(f"resume: cannot read {run_dir / 'checkpoint' / 'latest.json'}: step {step!r} is not "
                          f"a step number")
    folder = run_dir / "checkpoint" / f"step-{step:06d}"
    for rank in range(ranks):
        path = folder / f"rank{rank}.pt"
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(f"resume: {run_dir} has an incomplete checkpoint: {path.relative_to(run_dir)} is "
                              f"{'not readable' if path.is_file() else 'missing'} (checkpoint/latest.json names step "
                              f"{step} of {ranks} ranks); resume from a run whose checkpoint is whole")
