"""Running on many processes and on shared machines: process groups, collectives, threads, cluster submission."""
