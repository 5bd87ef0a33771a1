"""Faults on a virtual cluster's nodes, as a user injects them (Jepsen's nemesis for the virtual cluster:
``workbench vcluster kill|partition|heal|restore``), and which nodes answer the head (what a restart is
placed on: :class:`~workbench.runtime.client.batch_run.BatchRun`). A mixin of
:class:`~workbench.vcluster.cluster.VirtualCluster`, which gives it ``plan``, ``name``, ``check_node``,
``processes`` and ``exec``."""
from __future__ import annotations

import os

from . import tools, wiring


class Faults:
    """The fault injection and the liveness view of a :class:`~workbench.vcluster.cluster.VirtualCluster`."""

    def answering(self, timeout: float = 2.0) -> list[int]:
        """The nodes that answer the head now (a TCP connection to a closed port, refused at once by a node
        that is there), in order: a partitioned node, or one killed with ``down=True``, does not.

        Args:
            timeout: seconds to wait for each node's answer.

        Returns:
            The indices of the nodes that answer.
        """
        return wiring.answering(self.plan, timeout)

    def partition(self, node: int) -> None:
        """Cut node ``node`` off: every link of it down, nothing reaches it or leaves it; its processes run on.

        Args:
            node: the node's index.

        Raises:
            PlanError: ``node`` is not one of the cluster's node indices.
            VirtualClusterError: a link could not be set down.
        """
        self.set_link(node, False)

    def heal(self, node: int) -> None:
        """Node ``node``'s links up again (and its routes through them).

        Args:
            node: the node's index.

        Raises:
            PlanError: ``node`` is not one of the cluster's node indices.
            VirtualClusterError: a link or route could not be set.
        """
        self.set_link(node, True)

    def restore(self, node: int) -> dict:
        """Node ``node`` back, empty, as after a reboot: its processes killed, its own ``/tmp`` and
        ``/dev/shm`` emptied (what the cluster exposes there, such as the shared folder, is left alone) and
        its SysV IPC removed, its links up.

        Args:
            node: the node's index.

        Returns:
            What went: ``{"processes": n, "files": n}``.

        Raises:
            PlanError: ``node`` is not one of the cluster's node indices.
            subprocess.TimeoutExpired: emptying its folders took more than 60 s.
        """
        self.check_node(node)
        killed = self.kill_node(node)
        keep = " ".join(f"'{p}'" for p in wiring.exposed_paths(self.plan))
        # an entry of /tmp or /dev/shm goes unless it is, or leads to, an exposed path (a bind mount of the host's)
        script = (f"n=0; for e in /tmp/* /tmp/.[!.]* /dev/shm/* /dev/shm/.[!.]*; do [ -e \"$e\" ] || continue; "
                  f"for k in {keep} ''; do case \"$k/\" in \"$e\"/*) continue 2;; esac; done; "
                  "rm -rf --one-file-system \"$e\" && n=$((n+1)); done; ipcrm -a 2>/dev/null; echo $n")
        done = self.exec(node, ["sh", "-c", script], timeout=60)
        self.heal(node)
        return {"processes": len(killed), "files": int(done.stdout.split()[-1]) if done.stdout.split() else 0}

    def set_link(self, node: int, up: bool) -> None:
        """Take node ``node``'s links down (a partition: nothing reaches it or leaves it) or up again.

        Args:
            node: the node's index.
            up: True: up (with its routes), False: down.

        Raises:
            PlanError: ``node`` is not one of the cluster's node indices.
            VirtualClusterError: ``ip`` failed to set a link or route.
        """
        self.check_node(node)
        devices = ["eth0"] + [c.device(node) for c in self.plan.cables if node in (c.a, c.b)]
        tools.ip_batch([f"link set dev {d} {'up' if up else 'down'}" for d in devices],
                        f"vcluster {self.name}: set node {node}'s links {'up' if up else 'down'}",
                        netns=self.plan.netns(node))
        if up and not self.plan.switched:  # routes through a cable vanish with it: put them back
            tools.ip_batch([f"route replace {r.dst}/32 via {r.via} dev {r.device} onlink src {self.plan.address(node)}"
                             for r in self.plan.routes(node)], f"vcluster {self.name}: restore node {node}'s routes",
                            netns=self.plan.netns(node))

    def kill_node(self, node: int, down: bool = False) -> list[int]:
        """SIGKILL every process on ``node`` at once (a node that crashed; its namespaces, files and links
        stay: :meth:`restore` brings it back empty).

        Args:
            node: the node's index.
            down: its links go down as well, as a crashed machine that answers nothing until :meth:`restore`.

        Returns:
            The pids killed.

        Raises:
            PlanError: ``node`` is not one of the cluster's node indices.
        """
        import signal
        self.check_node(node)
        pids = self.processes(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if down:
            self.set_link(node, False)
        return pids
