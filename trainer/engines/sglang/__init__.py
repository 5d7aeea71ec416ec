"""SGLang: the HTTP client of its native API, the launch of its servers and router, a run's servers as one engine."""
