"""Ascendra's decisions as pure functions of (state, now): value functions, selection,
offload, admission, routing and the performance model. No I/O, no clocks."""
