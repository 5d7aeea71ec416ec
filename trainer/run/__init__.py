"""The run's bookkeeping: the run record (episodes.jsonl), exact resume, metrics, per-task errors and CPU use."""
