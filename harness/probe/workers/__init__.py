"""The processes a probe runs in: pass workers (one per core), isolated rows under a timeout, torchrun ranks, and one side of a tree diff."""
