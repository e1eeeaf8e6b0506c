"""The `resid` command line, the top layer: one module per subcommand (decompose, attribute, lens, predict,
info, ablate, neurons), each with `add_parser`, `check(args)` (the arguments that need no model, checked
before loading one) and `run(model, args)`; `main` parses and dispatches; `arguments` holds the shared checks."""
