"""The controller core (docs/design.md §3): the controller's decisions, sans-I/O -- events
in, actions out -- and everything only it uses. `controller_core.ControllerCore` is the
entry point; its components (ledger, late binding, recovery, hand-offs, prefixes) and
their structures live beside it. Nothing here opens a socket, reads a clock or sleeps
(tests/test_layers.py checks the folder)."""
