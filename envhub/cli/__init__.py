"""The `envhub` command line: one module per command family; `envhub.cli.main` builds the parser."""
