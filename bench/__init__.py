"""Benchmarks, load generation, simulation and reports; each script prints figures."""
