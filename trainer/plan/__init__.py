"""`envhub plan`: predict a training pipeline's throughput, utilisation and staleness from a recorded run.

`record.read_run` reads a run directory's stage times, `model.fit_model` fits how each stage's time depends on what
runs beside it, `simulate.simulate` replays the pipeline with other resources or settings (engines, env hosts,
learners, sync or async, staleness bound, redundancy), and `report` writes the JSON, tables and sweeps.
"""
