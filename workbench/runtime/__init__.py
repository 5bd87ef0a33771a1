"""Runtime, by process role (one sub-package each).

- :mod:`~workbench.runtime.rank`: code that runs on an MPI rank: ``worker`` (the program every
  rank runs), ``context`` (the rank's ``Context``: its parts ``shard``, ``replica``, ``monitor`` and the
  communicator), ``checkpoint``, ``sink`` (the engine's
  entry point for a notebook run and its signed stream to the notebook).
- :mod:`~workbench.runtime.client`: code in the notebook or CLI process: ``handle`` (the one run
  handle: status, records, store row, ``wait``; its states in ``run_state``), ``run`` (a notebook's
  ``Run`` on a cluster's engines), ``batch_run`` (the CLI's ``BatchRun``), ``watch`` (a run followed
  through the store), ``cluster`` (``wb.Cluster``; ``engines``: its engines as a launcher),
  ``records`` (clusters on disk, stale clean-up).
- :mod:`~workbench.runtime.launch`: starting ranks: ``launcher`` (the protocol: start, wait, signal,
  stop, records; the ``mpiexec`` and ``srun`` backends and ``run_mpi``), ``mpiexec`` (the commands),
  ``job`` (one launched job), ``signals``, ``blame`` of the failed rank, ``shm`` clean-up,
  ``rankguard`` (the parent of each rank, recording how it ended), ``engines`` (engine launchers by
  name), ``batch`` (a run under mpiexec or srun without a notebook).

Shared by all three: ``rundir`` (run folders, ids and file names), ``stream`` (the signed
frames of the live stream) and ``processes`` (ending processes: SIGTERM, a grace, SIGKILL).
Telemetry is :mod:`workbench.telemetry`; atomic writes are :mod:`workbench.files`.
"""
