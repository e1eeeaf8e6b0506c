"""The intervention-sweep engine: many interventions, one at a time, over many prompts, as one resumable job. Ablation
sweeps (resid.analyses.ablation) and exact activation patching (resid.analyses.patching.activation: resample
ablation with the other prompt of each pair as the donor) are both built on it.

Glossary:
    row        one (prompt, site): the prompt run with that one site replaced, and a metric of its prediction
    group      a few prompts run clean together (their donors appended); each row resumes from the group's clean
               residual entering its site's layer (model.resume) and unembeds only the last token
    chunk      a block of prompts x a block of sites: what one worker computes and the store keeps at once
    value      what a site is replaced with: zero, its mean over reference texts, or a donor prompt's value

    rows     batched (prompt x site) rows that reuse the clean prefix: what one chunk computes
    chunks   the sweep's job (SweepJob) and its chunks (prompt blocks x runs of layers), for the one driver
             (resid.analyses.distributed.driver) on any executor; what a store's signature records
    values   replacement values: reference texts, agnostic or per-position means, resample donors
    means    the reference means as a reduction over chunks of reference texts (on the sweep's executor)
    seq2seq  encoder-decoder models: sites on both stacks, encoder rows, means over the pairs

How a sweep runs (executor, workers, batch size, progress, result store) is its caller's Execution
(resid.analyses.Execution), handed to the driver whole.
"""
