"""The round and server side of the engine: the one round loop over a plan, task starts and ends, evaluations."""
