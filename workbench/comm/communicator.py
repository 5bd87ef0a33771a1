"""The rank's one communicator: every exchange an algorithm makes goes through it, and every message
is counted in its one :class:`~workbench.comm.hooks.Traffic` (in the spirit of torchft's
``Manager.allreduce``: an algorithm asks the communicator, never MPI itself).

What it does, for tensors laid out like the model's flat parameters (or like the tensors ``bounds``
name, relative to the tensor):

- :meth:`Communicator.allreduce`: the sum over the ranks, in the run's fusion buckets (Sync EASGD's
  weights, the periodic family's warm-up gradients);
- :meth:`Communicator.mean`: the mean over the ranks, in fp32, fp16 or bf16 on the wire (the periodic
  family's averages and outer exchanges);
- :meth:`Communicator.send`, :meth:`~Communicator.recv`, :meth:`~Communicator.isend`,
  :meth:`~Communicator.irecv`: point to point, whole or one message per tensor (the master-based
  family, a user's neighbour exchange);
- :meth:`Communicator.gradient_reducer`: sync-sgd's buckets, overlap, hooks and wire precision
  (:class:`~workbench.comm.strategies.GradientReducer`) on the same counter;
- :meth:`Communicator.over` / :meth:`~Communicator.dup`: the same over another communicator
  (Streaming DiLoCo's outer exchange in a thread), still counted in the same counter;
- control messages, never counted (as before this module): :meth:`~Communicator.barrier`,
  :meth:`~Communicator.broadcast_flag` (the agreed stop), :meth:`~Communicator.probe` and empty
  messages (:meth:`~Communicator.send_empty`, :meth:`~Communicator.recv_empty`: a master's loop).

A user's algorithm counts what it sends by other means with :meth:`Communicator.count_message`.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

from .buckets import bucket_bounds
from .buffers import FlatBuffer
from .hooks import Hook, Traffic, dense_bytes, wire_collective
from .implementations import buffer_wire_bytes
from .mpi_allreduce import allreduce as blocking_allreduce
from .mpi_allreduce import choose
from .names import AUTO
from .nonblocking import iallreduce
from .options import Communication
from .precision import WIRE_DTYPES
from .strategies import GradientReducer

Bounds = list[tuple[int, int]]


class Communicator:
    """This rank's exchanges over ``comm`` and their one counter.

    Args:
        comm: the mpi4py communicator the messages travel on.
        collective: the run's all-reduce (a schedule name, ``native`` or ``auto``).
        options: the run's communication options (``fusion_bytes`` cuts the buckets and the
            point-to-point messages; the gradient reducer reads the rest).
        timeout: seconds a nonblocking exchange may take (the run's ``comm_timeout``; None: no limit).
        bounds: the flat parameters' ``(start, stop)`` element ranges in registration order.
        traffic: the counter every message is counted in (default a new one).

    Attributes:
        rank, size: this rank's number and the ranks of ``comm``.
        traffic: the one counter (bytes on the wire, their dense fp32 equivalent, messages, skipped steps).
    """

    def __init__(self, comm: MPI.Comm, collective: str, options: Communication, timeout: float | None,
                 bounds: Bounds, traffic: Traffic | None = None) -> None:
        self.comm, self.collective, self.options, self.timeout = comm, collective, options, timeout
        self.bounds = bounds
        self.traffic = traffic if traffic is not None else Traffic()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def over(self, comm: MPI.Comm) -> "Communicator":
        """The same exchanges over ``comm`` (e.g. a duplicate, or a sub-communicator), counted in this
        communicator's counter."""
        return Communicator(comm, self.collective, self.options, self.timeout, self.bounds, self.traffic)

    def dup(self) -> "Communicator":
        """:meth:`over` a duplicate of this communicator (``MPI_Comm_dup``, a collective): its messages
        never match this one's, so a thread may exchange on it while this one is in use."""
        return self.over(self.comm.Dup())

    # -- counting -----------------------------------------------------------------------------------
    def count_message(self, wire_bytes: int, dense_wire_bytes: int | None = None) -> None:
        """Count one message this rank sent: ``wire_bytes`` bytes on the wire, and ``dense_wire_bytes``
        what dense fp32 would have sent (default the same bytes)."""
        traffic = self.traffic
        traffic.messages += 1
        traffic.wire_bytes += wire_bytes
        traffic.dense_wire_bytes += wire_bytes if dense_wire_bytes is None else dense_wire_bytes

    # -- all-reduce ---------------------------------------------------------------------------------
    def allreduce(self, buf: torch.Tensor, bounds: Bounds | None = None) -> None:
        """Sum ``buf`` over the ranks in place, in the run's fusion buckets (one message by default, one
        per tensor with ``fusion_bytes=0``) with the run's collective, each message counted (none on
        one rank). ``bounds``: the tensors ``buf`` holds (default the parameters'). Blocking: Sync EASGD
        overlaps it with the gradient in a thread, where blocking MPI calls release the GIL (a
        nonblocking handle's wait loop would compete with the computing thread)."""
        comm, collective = self.comm, self.collective
        for start, stop, _ in bucket_bounds(self.bounds if bounds is None else bounds, self.options.fusion_bytes,
                                            buf.element_size()):
            part = FlatBuffer(buf[start:stop])
            algorithm = choose(part, comm) if collective == AUTO else collective
            blocking_allreduce(buf[start:stop], comm, algorithm)
            if self.size > 1:
                self.count_message(buffer_wire_bytes(part, comm, algorithm), dense_bytes(stop - start, comm, algorithm))

    def mean(self, buf: torch.Tensor, bounds: Bounds | None = None, wire_dtype: str = "fp32") -> None:
        """Replace ``buf`` by its mean over the ranks, in the run's fusion buckets, each message sent in
        ``wire_dtype`` (``fp32``, ``fp16``, ``bf16``) and counted (none on one rank). fp32 is
        :meth:`allreduce`, then a division by the rank count (blocking: a thread overlaps it with inner
        steps). fp16/bf16 travel as such, pre-divided by the rank count, on the collective a message of
        that dtype runs (:func:`~workbench.comm.hooks.wire_collective`: ``ring`` for ``native`` and
        ``auto``), waited for within the run's ``comm_timeout``."""
        p = self.size
        if wire_dtype == "fp32":
            self.allreduce(buf, bounds)
            buf.div_(p)
            return
        dtype = WIRE_DTYPES[wire_dtype]
        comm, algorithm = self.comm, wire_collective(self.collective, dtype)
        for start, stop, _ in bucket_bounds(self.bounds if bounds is None else bounds, self.options.fusion_bytes,
                                            dtype.itemsize):
            part = buf[start:stop]
            # divided, then narrowed: not the gradient wire's in-place scale by 1/p, whose bits differ
            wire = (part / p).to(dtype)
            handle = iallreduce(wire, comm, algorithm, narrow_bf16=True)
            handle.wait(self.timeout)
            part.copy_(wire.to(part.dtype))
            if p > 1:
                self.count_message(handle.wire_bytes, dense_bytes(stop - start, comm, algorithm))

    def gradient_reducer(self, params: list[torch.nn.Parameter], grad: torch.Tensor, momentum: float = 0.0,
                         hook: Hook | None = None) -> GradientReducer:
        """A :class:`~workbench.comm.strategies.GradientReducer` of the gradient pool ``grad`` (laid out
        as the parameters ``params``, in this communicator's bounds) on this communicator, with the
        run's collective, options and timeout, counting into this communicator's counter. ``momentum``:
        CSC's momentum correction; ``hook``: a user's hook in place of the built-in ones."""
        return GradientReducer(params, self.bounds, grad, self.comm, self.collective, self.options,
                               momentum=momentum, timeout=self.timeout, hook=hook, traffic=self.traffic)

    # -- point to point -----------------------------------------------------------------------------
    def parts(self, t: torch.Tensor) -> list:
        """The messages a flat tensor laid out like the parameters travels in: numpy views of the whole,
        or one per tensor with ``fusion_bytes=0``."""
        if self.options.fusion_bytes != 0:
            return [t.numpy()]
        return [t[start:stop].numpy() for start, stop in self.bounds]

    def isend(self, t: torch.Tensor, dest: int, tag: int) -> list[MPI.Request]:
        """Start sending ``t`` to rank ``dest`` with ``tag`` (:meth:`parts`, each counted); returns the
        requests (``MPI.Request.Waitall`` them before touching ``t``)."""
        parts = self.parts(t)
        for part in parts:
            self.count_message(part.nbytes)
        return [self.comm.Isend(part, dest=dest, tag=tag) for part in parts]

    def irecv(self, t: torch.Tensor, source: int, tag: int) -> list[MPI.Request]:
        """Start receiving into ``t`` from rank ``source`` with ``tag`` (:meth:`parts`); returns the requests."""
        return [self.comm.Irecv(part, source=source, tag=tag) for part in self.parts(t)]

    def send(self, t: torch.Tensor, dest: int, tag: int) -> None:
        """:meth:`isend`, waited for."""
        MPI.Request.Waitall(self.isend(t, dest, tag))

    def recv(self, t: torch.Tensor, source: int, tag: int) -> None:
        """:meth:`irecv`, waited for."""
        MPI.Request.Waitall(self.irecv(t, source, tag))

    # -- control (not counted) ----------------------------------------------------------------------
    def barrier(self) -> None:
        """Every rank of the communicator reaches this point before any leaves it."""
        self.comm.Barrier()

    def broadcast_flag(self, flag: bool, root: int = 0) -> bool:
        """Collective: ``root``'s ``flag`` on every rank (one byte)."""
        data = bytearray([1 if flag else 0])
        self.comm.Bcast(data, root=root)
        return bool(data[0])

    def probe(self, source: int, status: MPI.Status) -> None:
        """Block until a message from ``source`` (``MPI.ANY_SOURCE``: anyone), of any tag, can be
        received; ``status`` then says whose and which tag."""
        self.comm.Probe(source=source, tag=MPI.ANY_TAG, status=status)

    def send_empty(self, dest: int, tag: int) -> None:
        """Send an empty message: a signal whose meaning is its ``tag`` (a worker's last message)."""
        self.comm.Send(b"", dest=dest, tag=tag)

    def recv_empty(self, source: int, tag: int) -> None:
        """Receive :meth:`send_empty`'s message."""
        self.comm.Recv(bytearray(0), source=source, tag=tag)
