"""The run directory and its record: atomic writes, the results schema, resume state; read by the run and the report."""
