"""One-off studies, one module each: questions asked of the simulator or the real daemon
(starvation, overload, long context, P/D and prefix capacity, fleet scaling, several models,
ablation, the baselines, GPU checks, the performance model's accuracy, live vs simulated),
and the paper's figures (`ascendra reproduce`) with their plots."""
