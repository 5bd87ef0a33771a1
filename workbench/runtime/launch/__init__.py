"""Starting ranks: mpiexec jobs (signals, rank blame, shared-memory clean-up), the rank guard,
engine launchers by name and batch runs."""
