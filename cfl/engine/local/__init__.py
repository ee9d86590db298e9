"""The local trainers: one client after another (the oracle), or all sampled clients at once (stacked or vmap)."""
