"""All-reduce algorithms, each written once as a function that returns a :class:`Schedule`.

Every generator works for any rank count (1, 2, 3, 5, 17, ...), not only powers of two.
Results are cached: calling a generator twice with the same arguments returns the same object,
so executors can cache their per-rank plans by schedule identity.

``SCHEDULES`` maps each name accepted by :func:`workbench.collectives.allreduce` to the
generator that takes only the rank count.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

from ..checks import integer
from .schedule import Schedule, Transfer, make_schedule

__all__ = ["ring", "recursive_doubling", "halving_doubling", "binary_tree",
           "double_binary_tree", "linear", "SCHEDULES", "tree_schedule"]


def _check_nranks(nranks: int) -> None:
    integer("nranks", nranks)


def ring(nranks: int, order: Sequence[int] | None = None) -> Schedule:
    """Ring all-reduce: reduce-scatter then all-gather around a ring, ``2(n-1)`` steps.

    ``order`` is the ring's rank sequence (a permutation of ``range(nranks)``; default
    ``0, 1, ..., n-1``): ``order[i]`` sends to ``order[i+1]``. Chunk ``c`` ends its
    reduce-scatter fully reduced at ring position ``c - 1``.
    """
    _check_nranks(nranks)
    order = tuple(range(nranks)) if order is None else tuple(int(r) for r in order)
    if sorted(order) != list(range(nranks)):
        raise ValueError(f"order must be a permutation of range({nranks}), got {list(order)}")
    return _ring(nranks, order)


@lru_cache(maxsize=None)
def _ring(n: int, order: tuple[int, ...]) -> Schedule:
    steps = []
    for s in range(n - 1):  # reduce-scatter: position i passes chunk (i - s) on, adding
        steps.append([Transfer(order[i], order[(i + 1) % n], (i - s) % n, True) for i in range(n)])
    for s in range(n - 1):  # all-gather: position i passes its finished chunk (i + 1 - s) on
        steps.append([Transfer(order[i], order[(i + 1) % n], (i + 1 - s) % n, False)
                      for i in range(n)])
    params = {} if order == tuple(range(n)) else {"order": list(order)}
    return make_schedule("ring", n, n, steps, **params)


def _largest_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1)


@lru_cache(maxsize=None)
def recursive_doubling(nranks: int) -> Schedule:
    """Recursive doubling: ``log2 n`` pairwise exchanges of the whole buffer (one chunk).

    For ``n`` not a power of two, with ``p`` the largest power of two below ``n``, ranks
    ``p..n-1`` first fold their buffer into rank ``r - p`` and get the result back at the end
    (two extra steps): the usual MPICH treatment of the remainder.
    """
    _check_nranks(nranks)
    p = _largest_power_of_two(nranks)
    extras = range(p, nranks)
    steps = [[Transfer(r, r - p, 0, True) for r in extras]]
    mask = 1
    while mask < p:
        steps.append([Transfer(r, r ^ mask, 0, True) for r in range(p)])
        mask <<= 1
    steps.append([Transfer(r - p, r, 0, False) for r in extras])
    return make_schedule("recursive_doubling", nranks, 1, steps)


@lru_cache(maxsize=None)
def halving_doubling(nranks: int) -> Schedule:
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, all-gather by doubling.

    ``2 log2 p`` steps for ``p`` a power of two, each rank sending ``(p-1)/p`` of the buffer
    in each phase. Non-powers of two fold the extra ranks in first and out at the end, as
    in :func:`recursive_doubling`. The buffer is split into ``p`` chunks.
    """
    _check_nranks(nranks)
    p = _largest_power_of_two(nranks)
    extras = range(p, nranks)
    steps = [[Transfer(r, r - p, c, True) for r in extras for c in range(p)]]
    lo, hi = [0] * p, [p] * p  # the chunk range [lo, hi) each rank is responsible for
    mask = p >> 1
    while mask:  # reduce-scatter by recursive halving
        step = []
        for r in range(p):
            mid = (lo[r] + hi[r]) // 2
            if r & mask:  # keep the upper half, send the lower half to the partner
                step += [Transfer(r, r ^ mask, c, True) for c in range(lo[r], mid)]
            else:
                step += [Transfer(r, r ^ mask, c, True) for c in range(mid, hi[r])]
        for r in range(p):
            mid = (lo[r] + hi[r]) // 2
            lo[r], hi[r] = (mid, hi[r]) if r & mask else (lo[r], mid)
        steps.append(step)
        mask >>= 1
    mask = 1
    while mask < p:  # all-gather by recursive doubling: swap finished ranges
        steps.append([Transfer(r, r ^ mask, c, False) for r in range(p)
                      for c in range(lo[r], hi[r])])
        new = [(min(lo[r], lo[r ^ mask]), max(hi[r], hi[r ^ mask])) for r in range(p)]
        lo, hi = [a for a, _ in new], [b for _, b in new]
        mask <<= 1
    steps.append([Transfer(r - p, r, c, False) for r in extras for c in range(p)])
    return make_schedule("halving_doubling", nranks, p, steps)


def tree_schedule(name: str, parents: Sequence[Sequence[int]], chunk_sets: Sequence[Sequence[int]],
                  nchunks: int) -> Schedule:
    """Pipelined reduce-then-broadcast over one or more trees that run at the same time.

    ``parents[t][v]`` is the parent of rank ``v`` in tree ``t`` (``-1`` for its root);
    tree ``t`` carries the chunks in ``chunk_sets[t]``, one after another. With ``D`` the
    tree's depth, a rank at depth ``d`` sends its ``j``-th chunk up (adding) at step
    ``j + D - d``, once all its children have; the root sends chunk ``j`` down at step
    ``j + D`` and each level passes it on one step later. ``len(chunks) + 2D - 1`` steps.
    """
    steps: dict[int, list[Transfer]] = {}
    for parent, chunks in zip(parents, chunk_sets):
        depth = _depths(parent)
        max_depth = max(depth)
        for v, p in enumerate(parent):
            if p < 0:
                continue
            for j, c in enumerate(chunks):
                steps.setdefault(j + max_depth - depth[v], []).append(Transfer(v, p, c, True))
                steps.setdefault(j + max_depth + depth[p], []).append(Transfer(p, v, c, False))
    ordered = [steps[t] for t in sorted(steps)]
    return make_schedule(name, len(parents[0]), nchunks, ordered)


def _depths(parent: Sequence[int]) -> list[int]:
    depth = [-1] * len(parent)

    def resolve(v: int, seen: int = 0) -> int:
        if depth[v] < 0:
            if seen > len(parent):
                raise ValueError(f"tree parents contain a cycle through rank {v}")
            depth[v] = 0 if parent[v] < 0 else resolve(parent[v], seen + 1) + 1
        return depth[v]

    return [resolve(v) for v in range(len(parent))]


def _check_pipeline(nchunks: int, multiple: int) -> None:
    if not isinstance(nchunks, int) or nchunks < multiple or nchunks % multiple:
        raise ValueError(f"nchunks must be a positive multiple of {multiple}, got {nchunks!r}")


@lru_cache(maxsize=None)
def binary_tree(nranks: int, nchunks: int = 8) -> Schedule:
    """Reduce to rank 0 over a binary heap tree, then broadcast back, pipelined over chunks.

    Rank ``v``'s parent is ``(v - 1) // 2``. ``nchunks`` pipeline chunks; the schedule has
    ``nchunks + 2*depth - 1`` steps.
    """
    _check_nranks(nranks)
    _check_pipeline(nchunks, 1)
    parent = [-1] + [(v - 1) // 2 for v in range(1, nranks)]
    return tree_schedule("binary_tree", [parent], [range(nchunks)], nchunks)


def nccl_btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """NCCL's binary tree (``ncclGetBtree``): ``(parent, child0, child1)``, ``-1`` for none.

    Ranks are arranged by their lowest set bit, so that roughly half the ranks are leaves.
    """
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= nranks:
        lowbit >>= 1
        down1 = -1 if lowbit == 0 else rank + lowbit
    return up, down0, down1


def double_binary_trees(nranks: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary trees as parent lists: the btree and its mirror (even
    ``n``) or its shift by one (odd ``n``), so most ranks are a leaf in one of them."""
    first = [nccl_btree(nranks, r)[0] for r in range(nranks)]
    if nranks % 2 == 0:
        def mapped(r): return nranks - 1 - r
    else:
        def mapped(r): return (r - 1) % nranks
    second = []
    for r in range(nranks):
        up = nccl_btree(nranks, mapped(r))[0]
        # mapped() is an involution for mirror; for the shift the inverse is +1.
        second.append(-1 if up < 0 else (nranks - 1 - up if nranks % 2 == 0 else (up + 1) % nranks))
    return first, second


@lru_cache(maxsize=None)
def double_binary_tree(nranks: int, nchunks: int = 8) -> Schedule:
    """NCCL-style double binary tree: two complementary trees, each carrying half the chunks.

    Both trees are pipelined at once (:func:`tree_schedule`); ``nchunks`` must be even.
    """
    _check_nranks(nranks)
    _check_pipeline(nchunks, 2)
    half = nchunks // 2
    first, second = double_binary_trees(nranks)
    return tree_schedule("double_binary_tree", [first, second],
                         [range(half), range(half, nchunks)], nchunks)


@lru_cache(maxsize=None)
def linear(nranks: int) -> Schedule:
    """The sequential baseline: rank 0 receives the other ranks' buffers one per step, then
    sends the sum back one rank per step; ``2(n-1)`` steps of one whole-buffer transfer each,
    the ``P(a + |W|b)`` cost that the EASGD paper replaces with a tree."""
    _check_nranks(nranks)
    steps = [[Transfer(r, 0, 0, True)] for r in range(1, nranks)]
    steps += [[Transfer(0, r, 0, False)] for r in range(1, nranks)]
    return make_schedule("linear", nranks, 1, steps)


#: Name -> generator taking only the rank count: the schedule names ``allreduce`` accepts.
SCHEDULES: dict[str, Callable[[int], Schedule]] = {
    "ring": ring,
    "recursive_doubling": recursive_doubling,
    "halving_doubling": halving_doubling,
    "binary_tree": binary_tree,
    "double_binary_tree": double_binary_tree,
    "linear": linear,
}



def __getattr__(name: str):
    if name == "ALGORITHMS":  # the name until issue 23, when it met optim.registry.ALGORITHMS (training algorithms)
        import warnings
        warnings.warn("workbench.schedules.ALGORITHMS is now SCHEDULES (ALGORITHMS names the training algorithms)",
                      DeprecationWarning, stacklevel=2)
        return SCHEDULES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
