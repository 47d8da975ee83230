"""Training heads (and a tuned backbone): the loop, heads, objectives, checkpoints."""
