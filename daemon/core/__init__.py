"""The controller core: sans-I/O decisions, events in, actions out (docs/design.md §2)."""
