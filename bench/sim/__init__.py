"""The simulator behind `ascendra simulate`, `capacity` and `plan`: the daemon's controller and
instance cores driven on a virtual clock (an event heap instead of asyncio and ZeroMQ), the
simulated box and its flags, per-request record keeping, and fleets of boxes behind a gateway
model."""
