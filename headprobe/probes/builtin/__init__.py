"""The built-in probes, one module each, named as a recipe names them (`probes.<name>`): each holds the probe's
function, its options (defaults and ranges), the checks its options need, the metrics it records (meaning, unit,
direction, chance, role as evidence, claim questions, headline place) and its cost prior, in one `Probe`
declaration that `registry.PROBES` points at. The estimators they call (`probes/linear.py`, `knn.py`, `spectrum.py`,
`orbits.py`, ...) stay one level up, importable on their own; a sub-package keeps the probe modules' names equal to
the probes' without clashing with those estimators' modules."""
