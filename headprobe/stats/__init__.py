"""Statistics: bootstrap intervals, statistics recomputed per resample, the buffer verdict."""
