"""QK attribution: why a head attended where it did, in the terms of an attribution graph (Kamath, Ameisen et al.
2025, "Tracing attention computation through feature interactions").

With the scales of the attention's pre-norm and q/k norms frozen at the run's and the rotary angles fixed by the
positions, a head's query at position q is affine in the residual entering its layer there, and its key at k in
the residual at k: the pre-softmax score q . k * scale is a bilinear form in the two residuals. Each residual is a
sum of terms, the writes into it at that position, in the run with every MLP spliced by its transcoder (error
kept: the model's own run):

    embed@p, pos_embed@p                the embedding writes
    layers[l].attn.head[h]@p            each earlier head's write there (z[h] @ W_O[h], through a post-norm's
                                        frozen scale): what attention moved to p (the graph's edges say from where)
    layers[l].mlp.feature[f]@p          each active transcoder feature's write, a * W_dec (a cross-layer
                                        transcoder's into every layer below): the graph's feature nodes
    layers[l].mlp.error@p | .skip@p     the transcoder's error (a graph node) and skip path x @ W_skip
    layers[l].attn.b_O@p | post_norm_bias@p | layers[l].mlp.b_dec@p | layers[l].mlp@0   the constants: output
                                        biases, post-norm biases, decoder biases, position 0's MLP writes where
                                        skip_bos makes them constants (as in the graph)
    layers[L].attn.b_Q@q | b_K@k        the query's (key's) own constant: the pre-norm's bias through W_Q, plus b_Q

so the score is a sum over pairs (query-side term, key-side term), exact to float rounding: tests/graphs compare the
pairs' sum with the run's own scores on every family resid loads.

    qk = graphs.QK(model, prompt, transcoders)            # one spliced run, kept
    head = Site(5, "attn", head=3, positions=(-1,))        # layer 5's head 3, at the last position
    result = qk.score(head, key=4)                         # a ScoreAttribution
    qk.score(5, 3, query=-1, key=4)                        # the same: layer and head as ints
    result.top(10); result.query_marginal(); result.key_marginal()
    qk.score(5, 3, query=-1, key=4, versus=2)              # score(q, 4) - score(q, 2): why 4 rather than 2
    qk.score(5, 3, query=-1, key=4, versus="mean")         # score(q, 4) minus the pattern-weighted mean score
    qk.validate(result, top=5)                             # remove terms in the real model: measured vs predicted

A contrast weighs keys (1 at `key`, -1 at `versus`, or -pattern[q, k'] at every key k' with "mean"); the key-side
terms of each weighted key appear scaled by its weight, and the pairs sum to the weighted sum of raw scores. Raw:
before a soft cap (Gemma 2's score is cap * tanh(raw / cap), increasing in raw).

    query_marginal()[i] = scale * Q_i . sum_j K_j     how much query-side term i raises the (contrasted) score:
                                                      which features make the head look
    key_marginal()[j]   = scale * sum_i Q_i . K_j     which terms make a key attractive

Cost: each term's query (key) is one [d_model] x [d_model d_head] product per head, cached per layer and position;
the pairs of one score are n_q x n_k x d_head multiply-adds, and `top` finds the largest block by block, so memory
stays linear in the terms (the full pair matrix exists only when `pairs()` is asked for).

The package, by job:

    decomposition.py    Terms and QK: the terms of a residual, their queries and keys, and `score` (a head's score
                        split into pairs); the score's pieces are the attention's own (Attention.score_rule,
                        frozen_qk, qk_norm_scale; Transformer.rotary_of)
    score.py            ScoreAttribution: one split score, its pairs, marginals and top pairs
    validation.py       QK.validate: each strong term removed in the real model, measured beside predicted
    summaries.py        QK.heads (every head's strongest pair) and QK.summaries (what the graph viewer shows)
"""

from resid.analyses.graphs.qk.decomposition import CAPTURE, QK, Terms
from resid.analyses.graphs.qk.score import PAIR_BLOCK, ScoreAttribution

__all__ = ["CAPTURE", "PAIR_BLOCK", "QK", "ScoreAttribution", "Terms"]
