pytest_plugins = ["envhub.sandboxes.testing"]  # shared sandbox pool fixtures
