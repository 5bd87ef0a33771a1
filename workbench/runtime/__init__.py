"""Runtime, by process role.

On a rank: ``worker`` (the program every rank runs), ``context`` (model, data shard, metrics),
``checkpoint``, ``telemetry``, ``live`` (the signed stream to the notebook), ``rankguard`` (the
parent of each rank, recording how it ended). In the notebook or CLI process: ``cluster``
(``wb.Cluster``), ``run`` (a live ``Run``). Launching: ``launcher`` (mpiexec, signals, rank blame)
and ``batch`` (a run under mpiexec without a notebook). ``rundir`` names a run folder's files.
"""
