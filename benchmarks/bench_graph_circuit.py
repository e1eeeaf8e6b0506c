"""A circuit from an attribution graph on SmolLM2-135M: the suggestion (pruning, supernodes, subgraph scores), the
features' labels and both interventions (necessity and sufficiency with every supernode ablated and steered, one
batched run), timed for a 16-token prompt, beside the forward pass and the graph itself; twice, to check that the
circuit is the same.

    python benchmarks/bench_graph_circuit.py [--transcoders DIR] [--repeats 3] [--tokens 16]

DIR: per-layer transcoders (`resid train-transcoder --layers all --out DIR`); without it, bench_qk.py's 30 random
ReLU transcoders (2,304 features, ~16 firing per position and layer): speed, not meaning. Target (issue 56): a
circuit (suggestion, scores and both interventions) in <= 5 s per graph on the CPU, deterministic across runs.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_qk import random_transcoders  # noqa: E402
from timing import interleaved  # noqa: E402

PROMPT = ("The Eiffel Tower is in the city of Paris, and the Colosseum is in the city of Rome, so the capital of "
          "Italy is")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcoders", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    import resid
    import resid.dictionaries
    from resid.analyses import graphs

    model = resid.load("smollm2-135m")
    transcoders = (resid.dictionaries.load(Path(args.transcoders), model) if args.transcoders
                   else random_transcoders(model))
    ids = model.to_tokens(PROMPT).ids[0, -args.tokens:]
    graph = graphs.attribute(model, ids, transcoders)
    print(f"{graph!r}; transcoders: {'random' if args.transcoders is None else args.transcoders}")

    def suggest():
        return graphs.circuit(graph)

    def labelled():
        kept = graph.prune().node_mask[:graph.n_features].nonzero().flatten()
        return graphs.circuit(graph, labels=graphs.labels(model, graph, transcoders, nodes=kept))

    def whole():
        found = labelled()
        return found, graphs.measure(model, found, transcoders)

    times = interleaved({"forward": lambda: model.run(ids[None]), "suggest + scores": suggest,
                         "+ labels": labelled, "+ both interventions": whole}, args.repeats)
    for name, seconds in times.items():
        print(f"{name:<22} {seconds:7.3f} s")
    (a, ma), (b, mb) = whole(), whole()
    same = ([(s.name, s.nodes, s.reasons) for s in a.supernodes] == [(s.name, s.nodes, s.reasons)
                                                                       for s in b.supernodes]
            and a.scores == b.scores and ma.equals(mb))
    print(f"{a!r}; {len(ma)} interventions in one batch; necessity {ma.attrs['necessity']:.3f}, sufficiency "
          f"{ma.attrs['sufficiency']:.3f}; the same on a second run: {same}")
    print(f"target <= 5 s per circuit: {'met' if times['+ both interventions'] <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
