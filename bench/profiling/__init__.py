"""`ascendra profile`: this machine's executor timed over a grid of steps, and the daemon's
own path on it timed live, into a profile file that `simulate`, `capacity` and `plan` take
as `--profile FILE` (profile_cmd.py, host_timing.py)."""
