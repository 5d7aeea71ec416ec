"""Code that runs inside vLLM's own processes (its virtualenv), put on their PYTHONPATH by the launcher."""
