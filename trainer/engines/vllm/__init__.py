"""vLLM: the client of a real vLLM server's HTTP API, how that server is started, and what it reads from disk."""
