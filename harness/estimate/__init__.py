"""What each recompute row of a GPU recipe retains per rank, measured on CPU on real MCore layers."""
