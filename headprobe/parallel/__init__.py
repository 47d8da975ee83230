"""Several processes: how they share the work and what they exchange."""
