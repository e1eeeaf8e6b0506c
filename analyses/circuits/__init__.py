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
HTML page). Every table (edges: writer and reader Site labels; curves) exports as any other, resid.analyses.tables.
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

__all__ = ["MIB_FRACTIONS", "EdgeGraph", "cmd", "cpr", "eap", "eap_ig", "evaluate", "exact", "faithfulness_curve",
           "matrix", "necessity_sufficiency", "pruned", "threshold", "top_k"]
