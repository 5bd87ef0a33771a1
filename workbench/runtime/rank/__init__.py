"""Code that runs on an MPI rank: the worker loop, its context, checkpoints and the live sink."""
