"""Training dictionaries (sparse autoencoders, transcoders) on a model's activations; see resid.analyses.training
modules: recipe (settings), coder + relu / topk / batchtopk / jumprelu (the recipes), trainer (one step),
activations (the pipeline), loop (train), checkpoint, evaluation."""
