"""The run's stores and files: checkpoints, client states on disk, the run directory and its lock."""
