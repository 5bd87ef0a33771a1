"""MultiTree (Huang et al., ISCA'21) and the TPU-style 2D ring, as ordinary Schedules.

MultiTree builds one spanning tree per root, all together, one time step at a time, so that no
directed link is used twice in a step: chunk ``r`` (1/N of the data) is reduce-scattered up
tree ``r`` (edges reversed, latest first) and all-gathered down it, ``2T`` steps in all, every
transfer one hop. The construction follows PAPERS.md §2 line by line.
"""
from __future__ import annotations

from .schedule import Schedule, ScheduleError, Transfer, make_schedule
from .topology import Topology


def multitree_trees(topo: Topology, k: int = 2) -> tuple[list[tuple[int, int, int, int]], int]:
    """The trees as edges ``(root, child, parent, t)`` and the number of steps ``T``.

    ``k``: k-ary growth — a parent attaches at most ``k - 1`` children per step and tree.
    """
    if not isinstance(k, int) or k < 2:
        raise ScheduleError(f"multitree: k must be an integer >= 2, got {k!r}")
    if not topo.direct:
        raise ScheduleError(f"multitree: {topo.kind} is a switched network; the switch-aware "
                            "construction is not implemented yet (direct networks: torus, mesh, ring, "
                            "fully_connected)")
    n = topo.nodes
    members = [{r} for r in range(n)]
    order = [[r] for r in range(n)]            # nodes in the order they joined tree r
    neighbours = [[u for u in topo.neighbors(p) if u < n] for p in range(n)]
    edges: list[tuple[int, int, int, int]] = []
    saturated = [set() for _ in range(n)]      # parents whose neighbours are all in tree r already
    t = 0
    while any(len(m) < n for m in members):
        avail = set(topo.links)
        # this step's candidate parents per tree, in join order; a parent that finds no child
        # cannot find one later in the same step (links only get used, trees only grow), so a
        # pointer moves past it: the same choices as rescanning from the first parent each turn
        candidates = [[p for p in order[r] if p not in saturated[r]] for r in range(n)]
        position = [0] * n
        children: dict[tuple[int, int], int] = {}
        added = True
        while added:  # rounds over the roots, one attachment per root and turn
            added = False
            for r in range(n):
                if len(members[r]) == n:
                    continue
                cand = candidates[r]
                while position[r] < len(cand):
                    p = cand[position[r]]
                    free = [c for c in neighbours[p] if c not in members[r]]
                    if not free:
                        saturated[r].add(p)
                        position[r] += 1
                        continue
                    c = next((c for c in free if (p, c) in avail), None)
                    if c is None:
                        position[r] += 1
                        continue
                    members[r].add(c)
                    order[r].append(c)
                    children[(r, p)] = children.get((r, p), 0) + 1
                    if children[(r, p)] >= k - 1:
                        position[r] += 1
                    avail.discard((p, c))
                    edges.append((r, c, p, t))
                    added = True
                    break
        if not children:
            raise ScheduleError(f"multitree: no progress at step {t} on {topo!r}")
        t += 1
    return edges, t


def multitree(topo: Topology, k: int = 2) -> Schedule:
    """MultiTree all-reduce on ``topo``: ``2T`` steps, chunk r along tree r, one hop each."""
    edges, T = multitree_trees(topo, k)
    steps: list[list[Transfer]] = [[] for _ in range(2 * T)]
    for root, child, parent, t in edges:
        steps[T - 1 - t].append(Transfer(child, parent, root, True))   # reduce-scatter, up
        steps[T + t].append(Transfer(parent, child, root, False))      # all-gather, down
    return make_schedule("multitree", topo.nodes, topo.nodes, steps, k=k, tree_steps=T)


def ring_2d(rows: int, cols: int) -> Schedule:
    """TPU-style 2D ring: reduce-scatter along each row's ring, all-reduce each chunk along the
    column rings, all-gather along the rows. Rank ``i`` is at row ``i // cols``, column
    ``i % cols``; the buffer is split into ``rows * cols`` chunks."""
    for name, value in (("rows", rows), ("cols", cols)):
        if not isinstance(value, int) or value < 1:
            raise ScheduleError(f"ring_2d: {name} must be an integer >= 1, got {value!r}")
    n, nchunks = rows * cols, rows * cols

    def rank(r: int, c: int) -> int:
        return r * cols + c

    steps: list[list[Transfer]] = []
    # row reduce-scatter: column position c ends owning chunk group c (chunks c*rows .. c*rows+rows-1)
    for s in range(cols - 1):
        steps.append([Transfer(rank(r, c), rank(r, (c + 1) % cols), g * rows + j, True)
                      for r in range(rows) for c in range(cols)
                      for g in [(c - s - 1) % cols] for j in range(rows)])
    # column ring all-reduce of each owned group: chunk g*rows + j, owner column g
    for s in range(rows - 1):  # reduce-scatter along the column
        steps.append([Transfer(rank(r, g), rank((r + 1) % rows, g), g * rows + (r - s - 1) % rows, True)
                      for g in range(cols) for r in range(rows)])
    for s in range(rows - 1):  # all-gather along the column
        steps.append([Transfer(rank(r, g), rank((r + 1) % rows, g), g * rows + (r - s) % rows, False)
                      for g in range(cols) for r in range(rows)])
    # row all-gather
    for s in range(cols - 1):
        steps.append([Transfer(rank(r, c), rank(r, (c + 1) % cols), g * rows + j, False)
                      for r in range(rows) for c in range(cols)
                      for g in [(c - s) % cols] for j in range(rows)])
    return make_schedule("ring_2d", n, nchunks, steps, rows=rows, cols=cols)
