"""Code in the notebook or CLI process: ``Cluster``, ``Run`` and the records of clusters on disk.
Never imports mpi4py: only ranks initialise MPI."""
