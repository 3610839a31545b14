"""The controller core (docs/design.md §3): the controller's decisions, sans-I/O -- events
in, actions out -- and everything only it uses. `controller_core.ControllerCore` is the
entry point; its components (ledger, waiting room, prefix index, recovery, hand-offs,
roles) and their structures live beside it, and `core_view.CoreView` is what the rest of
the daemon reads of it. Nothing here opens a socket, reads a clock or sleeps
(tests/test_layers.py checks the folder)."""
