"""Micro-benchmarks: how long one piece of the serving path takes -- a schedule() call, the
LP's policy work, one decode step, a garbage collection, SSE streaming, offline throughput --
with what they share to time themselves and to compare with another checkout."""
