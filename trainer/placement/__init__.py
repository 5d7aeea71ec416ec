"""`envhub train --dry-run`: where each process of a run goes and the memory it needs, before anything starts.

`shapes` finds the model's architecture (its config.json, or a shipped table of well-known shapes), `memory` turns
a shape and the run's settings into bytes (weights, gradients, Adam states, activations, KV cache), `placement` puts
the learner, the engines and the env workers on the machine and refuses what cannot fit or start, and `report`
prints it as text or JSON.
"""
