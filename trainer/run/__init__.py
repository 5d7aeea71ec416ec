"""The run's bookkeeping and sharing: the run record (episodes.jsonl), exact resume, metrics, per-task errors, CPU use,
the cores and the GPU's graph captures shared by engine and learner."""
