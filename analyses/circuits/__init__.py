"""Circuits at the edge level: the edge graph of a model (writers, readers, edges as pairs of resid.Site), edge
scores by gradients (EAP, EAP-IG) or by exact patching, circuits chosen from them and measured in the real model as
MIB measures them (faithfulness curves, CPR, CMD), necessity and sufficiency, for edge sets and node sets.

    scores = circuits.eap(model, clean, corrupt, targets, baselines)            # or eap_ig(..., steps=5), exact(...)
    curve = circuits.faithfulness_curve(model, clean, corrupt, targets, scores, baselines)
    circuits.cpr(curve), circuits.cmd(curve)
    mask = circuits.top_k(graph, circuits.matrix(graph, scores), k=200)       # graph = circuits.EdgeGraph.of(config)

Modules: graph (the edge graph), patched (the edge-patched forward pass every method runs), inputs (pairs and
metric: the one place the patching package is read), scores (the edge table and its driver job), eap, eap_ig,
exact, selection (top-k, threshold, pruning), evaluation (circuits measured), figure (a circuit drawn, and as an
HTML page), seq2seq (encoder-decoders: the two stacks' graphs joined by cross-attention; `graph_of(model)` gives
either graph). Every table (edges: writer and reader Site labels; curves) exports as any other, resid.analyses.tables.

Families: pre-norm decoders (heads write one by one); post-norm decoders (Gemma 2/3, OLMo 2: a layer's attention is
one writer); latent attention (DeepSeek: one key/value reader per layer); mixtures of experts (an MLP is one node);
encoder-decoders (T5: exact, evaluate, faithfulness curves, necessity and sufficiency with source= and
corrupt_source=; EAP and EAP-IG refused). Post-LN models (BERT, Marian) and models without logits are refused.
"""

from resid.analyses.circuits.eap import eap
from resid.analyses.circuits.eap_ig import eap_ig
from resid.analyses.circuits.evaluation import (
                                                MIB_FRACTIONS,
                                                cmd,
                                                cpr,
                                                evaluate,
                                                faithfulness_curve,
                                                necessity_sufficiency,
)
from resid.analyses.circuits.exact import exact
from resid.analyses.circuits.graph import EdgeGraph
from resid.analyses.circuits.scores import matrix
from resid.analyses.circuits.selection import pruned, threshold, top_k
from resid.analyses.circuits.seq2seq import Seq2SeqGraph, graph_of

__all__ = ["MIB_FRACTIONS", "EdgeGraph", "Seq2SeqGraph", "cmd", "cpr", "eap", "eap_ig", "evaluate", "exact",
           "faithfulness_curve", "graph_of", "matrix", "necessity_sufficiency", "pruned", "threshold", "top_k"]
