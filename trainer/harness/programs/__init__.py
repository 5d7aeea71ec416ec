"""Programs of the built-in harnesses: each runs inside a harness sandbox as the agent (not imported by envhub)."""
