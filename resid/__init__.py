"""resid: a hooked Transformer whose every sublayer writes named, typed tensors into an explicit
residual-stream object. See README.md.

Axes (every shape annotation and einsum in resid and its analyses names them):

    batch     prompts in a padded batch
    pos       residual positions: padded sequence indices (or the captured positions, in the order asked)
    key_pos   key positions an attention head reads from
    head      attention heads (n_heads); kv_head: key/value heads, fewer under grouped-query attention
    d_head    per-head width;  d_model: residual stream width;  d_vocab: vocabulary size; d_head_v: each head's
              value and z width where it differs (DeepSeek's latent attention); kv_rank: that attention's latent
    d_mlp     MLP hidden width; one neuron (Geva's key/value memory) per index (per expert, in a mixture)
    expert    the experts of a sparse mixture-of-experts MLP (Mixtral: n_experts, experts_per_token per token;
              DeepSeek: the last n_shared_experts read by every token)
    component one write into the residual stream (embedding, a sublayer, a head, ...)

Positions given to any public API (Capture, Site, logits_at lists, every analysis) are prompt-relative:
0 is a prompt's first real token and -1 its last, whatever the padding (resid.Tokens maps them).
"""

import os

# RESID_TYPECHECK=1: the jaxtyping + beartype runtime checks that pytest runs with
# (--jaxtyping-packages=resid,beartype.beartype), in any process. The hook instruments only modules
# imported after it is installed, so it comes before every import of resid's own submodules below; it covers
# resid.analyses too (installed from the analyses/ folder), which is always imported after this package.
if os.environ.get("RESID_TYPECHECK") == "1":
    import jaxtyping

    jaxtyping.install_import_hook("resid", "beartype.beartype")

import importlib

from resid.errors import ResidError
from resid.load import known_models, load

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, provenance sidecars record it

# Every other public name is imported at its first use (PEP 562), so that `import resid` costs no torch: the
# command line's --help, --version and argument errors answer in milliseconds. `load` and `known_models` are
# bound above because the subpackage resid.load shares the name (importing it would otherwise rebind
# `resid.load` to the package); their module imports the loaders only when called.
_LAZY = {
    "Capture": "resid.capture",
    "ModelConfig": "resid.config",
    "RopeScaling": "resid.config",
    "Generation": "resid.generate",
    "HookNames": "resid.hook_names",
    "Identity": "resid.identities",
    "identity": "resid.identities",
    "Padded": "resid.selection",
    "Add": "resid.interventions",
    "Hook": "resid.interventions",
    "Intervention": "resid.interventions",
    "Replace": "resid.interventions",
    "Scale": "resid.interventions",
    "Site": "resid.sites",
    "ZeroAblate": "resid.interventions",
    "keep_freed_memory": "resid.allocator",
    "Memory": "resid.model",
    "Run": "resid.model",
    "Transformer": "resid.model",
    "CrossRecord": "resid.records",
    "EncoderDecoder": "resid.seq2seq",
    "Seq2SeqRun": "resid.seq2seq",
    "AttnRecord": "resid.stream",
    "LayerRecord": "resid.stream",
    "MLPRecord": "resid.stream",
    "ResidualStream": "resid.stream",
    "Tokenizer": "resid.tokenizer",
    "Tokens": "resid.tokenizer",
    "first_layers": "resid.load.first_layers",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'resid' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Add",
    "AttnRecord",
    "Capture",
    "CrossRecord",
    "EncoderDecoder",
    "Generation",
    "Hook",
    "HookNames",
    "Identity",
    "Intervention",
    "LayerRecord",
    "MLPRecord",
    "Memory",
    "ModelConfig",
    "Padded",
    "RopeScaling",
    "Replace",
    "ResidError",
    "ResidualStream",
    "Run",
    "Scale",
    "Seq2SeqRun",
    "Site",
    "Tokenizer",
    "Tokens",
    "Transformer",
    "ZeroAblate",
    "first_layers",
    "identity",
    "keep_freed_memory",
    "known_models",
    "load",
]
