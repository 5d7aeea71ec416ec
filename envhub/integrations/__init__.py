"""envhub envs in other trainers: any registered env id, bundled or your own (`--import`, plugins), trains there.

- `envhub.integrations.trl`: TRL's `GRPOTrainer`; tool envs as an `environment_factory` class, any env through a
  `rollout_func` (`pip install 'envhub[trl]'`).
- `envhub.integrations.verl`: verl's agent loop, `EnvhubAgentLoop`, with the agent-loop YAML and parquet dataset
  verl reads (`pip install 'envhub[verl]'`).
- `envhub.integrations.skyrl`: SkyRL's gym, `EnvhubTextEnv` registered with `skyrl_gym` (`pip install
  'envhub[skyrl]'`).

Each module imports its trainer only when a piece needs it, and says which pip command is missing otherwise;
`episode` is the token-level episode shared by the trainers whose generation envhub drives. docs/integrations.md
shows each in use.
"""
