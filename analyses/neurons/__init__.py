"""FFN key-value neuron inspection (Geva et al. 2021, "Transformer Feed-Forward Layers Are Key-Value
Memories"; Geva et al. 2022, "Transformer Feed-Forward Layers Build Predictions by Promoting Concepts in the
Vocabulary Space").

Glossary (resid.components.mlp): neuron i of layer l has a *key* W_in[:, i] (with W_gate[:, i] for gated
MLPs), a *value* v_i = W_out[i] and, at each token, a *coefficient* m_i = post[i]. The MLP's output at a
token is the sum of its *sub-updates* m_i * v_i, plus b_out.

    from resid.analyses import neurons
    neurons.value_top_tokens(model, layers=[20], k=10)        # values read in vocabulary space
    neurons.top_activating(model, texts, layers=[20], k=20)   # keys: the corpus tokens that trigger them
    neurons.top_activating(model, texts, layers=[20], execution=Execution(executor="ray", workers=2))  # on Ray
    neurons.sub_updates(model, "The capital of France is")    # which memories build this prediction
    edits = neurons.set_coefficients(model, prompt, [(20, 5)], value=8.0, positions=[-1])
    neurons.prediction_change(model, prompt, edits)          # promote / suppress, and what changes

`sub_updates` ranks each layer's sub-updates at one token two ways: by size, |m_i| * ||v_i|| (Geva et al.
2022), and by direct contribution to the target's logit, m_i * (v_i . u') with u' the target's logit
direction through the final norm with its scale frozen (resid.readout), so the contributions of all
neurons, of b_out and of every other write sum exactly to the logit. For each ranking it reports what
share of the layer's update its top-k carry:

    explained_norm   = <S_k, U> / <U, U>     U = sum_i m_i v_i (the update without b_out), S_k = top-k sum
    explained_target = (S_k . u') / (U . u')

(1 when k covers every neuron; the first is the part of U along itself that the top-k provide).

Post-norms (Gemma 2/3, OLMo 2): a neuron's value as written into the residual is linear_post(v_i), through the
MLP post-norm's gain (and centering); its input-dependent scale s is left out where there is no run
(value_top_tokens: s > 0 rescales every token alike) and frozen from the run where there is one (sub_updates:
each neuron writes s * linear_post(m_i v_i), so the sub-updates still sum to the write).

Mixture of experts (Mixtral): neurons are addressed as (expert, neuron); expert e's neuron i writes
w_e * m_{e,i} * v_{e,i}, w_e the token's router weight (0 where not routed). value_top_tokens and top_activating
take `experts=`, sub_updates ranks every (expert, neuron) of a layer together, and the coefficient edits take
(layer, expert, neuron) triples; their frames get an `expert` column after `layer`.
"""

from resid.analyses.neurons.edits import prediction_change, scale_coefficients, set_coefficients
from resid.analyses.neurons.keys import top_activating
from resid.analyses.neurons.sub_updates import sub_update_vectors, sub_updates
from resid.analyses.neurons.values import value_top_tokens

__all__ = [
    "prediction_change",
    "scale_coefficients",
    "set_coefficients",
    "sub_update_vectors",
    "sub_updates",
    "top_activating",
    "value_top_tokens",
]
