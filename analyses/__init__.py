"""Analyses over resid runs: pure functions (model, inputs, options) -> tidy pandas DataFrame.

    ablation       layer / sublayer / head / neuron ablation sweeps (zero, mean, resample), crash-safe
    ablation_sites what a sweep ablates, and its signature for resuming
    ablation_values replacement values: reference means (agnostic or per position) and resample donors
    metrics        scalar metrics of a next-token prediction
    plots          plotly figures of the DataFrames
    prompts_file   JSONL prompt sets for scripts
    store          crash-safe, resumable result files (Parquet / CSV)
    tokens         targets and baselines as single token ids
"""
