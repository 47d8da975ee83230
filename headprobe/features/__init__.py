"""Features: batched extraction, the on-disk cache, tensor files, orbit sweeps' features."""
