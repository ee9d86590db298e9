"""Records: the plain data a run accumulates (its snapshot and progress, the methods' states, the communication
ledger) and the names of its run directory. The engine produces them; metrics and reports read them."""
