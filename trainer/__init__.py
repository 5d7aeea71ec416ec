"""The trainer (installed as `envhub.trainer` from the top-level `trainer/` folder): engines serve the policy, rollouts
play episodes into a staleness-bounded queue, the learner steps on them, `train.Trainer` runs the loop."""
