"""Rollout: the tasks each group plays, the producer that keeps groups in flight, where episodes are played (in this
process or on Ray workers), the rollout worker that turns env text into token ids, and the queue to the learner."""
