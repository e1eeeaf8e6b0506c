"""The `resid` command line, the top layer: one module per subcommand (decompose, attribute, lens, predict,
info, ablate, neurons), each with `add_parser` and `run(model, args)`; `main` parses and dispatches."""
