"""Analyses over resid runs: pure functions (model, inputs, options) -> tidy pandas DataFrame.

    attribution    direct logit attribution to embeddings, heads / sublayers, neurons (exact, projected)
    corpus         text corpora for neuron scans (lists, .txt, .jsonl) and the public-domain demo corpus
    directions     logit directions through the final norm with its scale frozen
    logit_lens     the logit lens (recomputed or frozen final norm), with target rank, entropy and KL
    neurons        FFN key-value memories (Geva et al.): values, top-activating contexts, sub-updates, edits
    neuron_*       their parts: neuron_values, neuron_keys, neuron_edits, neuron_plots
    provenance     how a result was produced (model hash, analysis, parameters), for tables' sidecars
    prompts        prompt lists and prompt-relative positions in padded batches
    tables         CSV / Parquet / LaTeX / Markdown export with a provenance sidecar; exact read-back
    ablation       layer / sublayer / head / neuron ablation sweeps (zero, mean, resample), crash-safe
    ablation_sites what a sweep ablates, and its signature for resuming
    ablation_values replacement values: reference means (agnostic or per position) and resample donors
    metrics        scalar metrics of a next-token prediction
    plots          plotly figures of the DataFrames
    prompts_file   JSONL prompt sets for scripts
    store          crash-safe, resumable result files (Parquet / CSV)
    tokens         targets and baselines as single token ids
"""
