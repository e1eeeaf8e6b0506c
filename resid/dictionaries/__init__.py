"""Learned dictionaries (sparse autoencoders, transcoders, cross-layer transcoders) read from the formats of
SAELens, Gemma Scope, sparsify and circuit-tracer, computed exactly as those libraries compute them, and checked
against the model they are applied to.

    import resid.dictionaries
    sae = resid.dictionaries.load("path/to/sae_folder", model)     # or a Hub id (needs the network once)
    sae = resid.dictionaries.load("gemma-scope-2b-pt-res-canonical", sae_id="layer_12/width_16k/canonical",
                                  model=model)                     # SAELens's names (resid.dictionaries.releases)
    acts, reconstruction = sae(x)                                  # x: [... d_in], acts: [... feature]
    sae.site_in                                                    # the resid Site its hook reads

    run = model.run(prompts, dictionaries=[sae, Splice(transcoder)])  # observe one, splice the other
    run.dictionaries[sae.name].acts, .reconstruction, .error       # [batch pos feature], [batch pos d_out]
    run = model.run(prompts, dictionaries=[Splice(clt)])           # a cross-layer transcoder replaces every MLP
    run.dictionaries[clt.name].acts, .written(source, target)      # [layer batch pos feature], [batch pos d_out]

Axes: `feature` (d_sae) the learned features, `d_in` / `d_out` the widths of the tensors a dictionary reads and
reconstructs, `layer` the model's layers (cross-layer transcoders). See resid.dictionaries.dictionary for the maths,
resid.dictionaries.hooks for hook names -> sites, resid.dictionaries.check for the checks against a model.
"""

from resid.dictionaries.attach import Observe, Splice, feature_edits
from resid.dictionaries.check import check
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import ActivationFunction, Binding, Dictionary, InputNormalization, Weights
from resid.dictionaries.edits import feature_site, named
from resid.dictionaries.encoded import CrossLayerEncoded, Encoded
from resid.dictionaries.hooks import HookPoint, hook_point
from resid.dictionaries.load import detect, load

__all__ = ["ActivationFunction", "Binding", "CrossLayerEncoded", "CrossLayerTranscoder", "Dictionary", "Encoded",
           "HookPoint", "InputNormalization", "Observe", "Splice", "Weights", "check", "detect", "feature_edits",
           "feature_site", "hook_point", "load", "named"]
