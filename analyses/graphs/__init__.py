"""Attribution graphs (Ameisen et al. 2025; circuit-tracer): a prompt's prediction traced through transcoder
features. Each MLP is replaced by its transcoder, attention patterns and norm scales are frozen from the run, and
the model becomes linear in its nodes (token embeddings, active features, error terms), so every edge is an exact
direct effect.

    graph = graphs.attribute(model, "The capital of France is", transcoders)   # a Graph
    graph.to_frame(); graph.edges(); graph.scores(); graph.prune(0.8, 0.98)
    graphs.write_json(graph, "graph.json")     # the pruned graph, as circuit-tracer's and Neuronpedia's viewers read it
    graphs.write_html(graph, "graph.html")     # resid's own viewer of it: one self-contained page
    split = graphs.split_heads(model, graph.pruned(), transcoders)   # edges by the head of their last attention hop
    qk = graphs.QK(model, prompt, transcoders)  # why a head attended: its score split into pairs of terms (qk/)
    table = graphs.labels(model, graph, transcoders)    # short feature labels without an LM (labels.py)
    circuit = graphs.circuit(graph, labels=table)       # pruned features in supernodes, subgraph scores (circuit.py)
    measured = graphs.measure(model, circuit, transcoders)   # necessity, sufficiency, per supernode (measure.py)
"""

from resid.analyses.graphs.attribute import attribute
from resid.analyses.graphs.circuit import Circuit, Supernode, circuit
from resid.analyses.graphs.export import write_json
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.heads import HeadSplit, split_heads
from resid.analyses.graphs.labels import labels
from resid.analyses.graphs.measure import measure
from resid.analyses.graphs.qk import QK
from resid.analyses.graphs.subgraph import subgraph_scores
from resid.analyses.graphs.viewer import write_html

__all__ = ["QK", "Circuit", "Graph", "HeadSplit", "Supernode", "attribute", "circuit", "labels", "measure",
           "split_heads", "subgraph_scores", "write_html", "write_json"]
