"""The capacity ruler: a layout's steady-state capacity on a workload (the steady-state rule,
the capacity search, seeds), the hardware ceiling beside it, the capacity table of every
workload x layout, and `ascendra plan`'s choice of a GPU split."""
