"""`envhub serve-engine`: the embedded engine behind SGLang's native HTTP API and OpenAI-compatible routes."""
