"""Several processes: process state, collectives, probes and seeds shared out, launch checks."""
