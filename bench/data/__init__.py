"""Packaged data and how it is derived: the request-length traces (trace_data/) and the
published reference numbers the GPU profiles are checked against (reference_data/), their
loader (profile_refs.py) and the scripts that derive them from the raw files."""
