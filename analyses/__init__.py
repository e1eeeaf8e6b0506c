"""Analyses over resid runs: pure functions (model, inputs, options) -> tidy pandas DataFrame.

Planned modules (see DESIGN.md): logit_lens, attribution, neurons, ablation, tables, plots.
"""
