"""Experiment grids launched through submitit (local or Slurm): expansion, run state, status."""
