"""Subcommands of `resid`: each module has `add_parser(commands, common)` and `run(model, args) -> str`."""
