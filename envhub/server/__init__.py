"""Envs over the network: the envhub-protocol server, the OpenEnv-protocol server, and the one trust layer they share
(the operator's policy, the client guard, the session table)."""
