"""`ascendra chaos`: a real daemon under load and injected faults (chaos_run.py), its
streaming clients (chaos_client.py), the garbage it sends the controller (garbage_frames.py)
and the verb (chaos_cmd.py)."""
