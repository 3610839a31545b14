"""A real daemon as a subprocess: start it and learn its port (daemon_launcher.py), read
its instance processes from /proc (processes.py). Used by `ascendra chaos`, the live
benches and the daemon tests (tests/daemon_fixture.py)."""
