"""The application entry points: the `cfl` command, the Python API, one run end to end, and sweeps."""
