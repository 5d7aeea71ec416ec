"""Envs over the network: the envhub-protocol server, the OpenEnv-protocol server, and the operator's policy and client
guard they enforce."""
