"""CLI subcommands, one module each (discovered by `rankwise.cli`)."""
