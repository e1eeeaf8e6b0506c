"""Training dictionaries (sparse autoencoders, transcoders) on a model's activations, and evaluating them.

    from resid.analyses.training import Recipe, Spec, evaluate, train
    sae, = train(model, corpus.demo(), [Site(15, "resid_post")], Recipe(activation="topk", k=32),
                 Execution(out="sae"))
    evaluate(model, sae, held_out)          # FVU, L0, dead / dense fractions, CE loss recovered, KL

    recipe       Recipe: the settings, and which library's recipe each activation function follows
    coder        the trainable weights shared by every recipe (initialisation, unit-norm decoder, export)
    relu topk batchtopk jumprelu    one recipe each (SAELens, sparsify, dictionary_learning, SAELens)
    trainer      Trainer: one dictionary's optimizer step (Adam, warm-up and decay), fit() on ready tensors
    activations  Activations: the corpus through the model, every Site read from one forward, a seeded shuffling
                 buffer; BlockJob: one block of it, in process or on a Ray worker
    loop         Spec, train(): several dictionaries from one stream, a step job of the step driver
                 (resid.analyses.distributed.steps: checkpoints, progress, Ray), SAELens folders
    crosslayer   train_crosslayer(): a cross-layer transcoder over every layer from the same stream and step job,
                 saved in circuit-tracer's CLT format
    evaluation   evaluate(): the metrics as a table, a reduction of the driver
    replacements evaluate_replacements(): sets of transcoders (per-layer, skip, cross-layer) replacing every MLP at
                 once, and the replacement and completeness scores of the graphs they give
    splice       the splices at chosen positions both evaluations run

Imported lazily, so that `resid train-sae --help` loads no torch.
"""

import importlib

_PUBLIC = {"Recipe": "recipe", "Spec": "loop", "train": "loop", "evaluate": "evaluation", "Trainer": "trainer",
           "fit": "trainer", "Activations": "activations",
           "train_crosslayer": "crosslayer", "evaluate_replacements": "replacements"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"resid.analyses.training.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module 'resid.analyses.training' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
