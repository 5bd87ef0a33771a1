"""Process-side runtime: telemetry, the mpiexec launcher (worker loop, cluster come later)."""
