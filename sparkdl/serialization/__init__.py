"""Arrow-based wire formats: the weights codec and Arrow-column to numpy conversion."""
