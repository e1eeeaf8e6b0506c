"""resid: a hooked Transformer whose every sublayer writes named, typed tensors into an explicit
residual-stream object. See README.md.

Axes (every shape annotation and einsum in resid and its analyses names them):

    batch     prompts in a padded batch
    pos       residual positions: padded sequence indices (or the captured positions, in the order asked)
    key_pos   key positions an attention head reads from
    head      attention heads (n_heads); kv_head: key/value heads, fewer under grouped-query attention
    d_head    per-head width;  d_model: residual stream width;  d_vocab: vocabulary size
    d_mlp     MLP hidden width; one neuron (Geva's key/value memory) per index (per expert, in a mixture)
    expert    the experts of a sparse mixture-of-experts MLP (Mixtral: n_experts, experts_per_token per token)
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

from resid.capture import Capture
from resid.config import ModelConfig, RopeScaling
from resid.errors import ResidError
from resid.generate import Generation
from resid.hook_names import HookNames
from resid.identity import Identity, identity
from resid.interventions import Add, Hook, Intervention, Replace, Scale, ZeroAblate
from resid.load import known_models, load
from resid.allocator import keep_freed_memory
from resid.model import Memory, Run, Transformer
from resid.records import CrossRecord
from resid.selection import Padded
from resid.seq2seq import EncoderDecoder, Seq2SeqRun
from resid.sites import Site
from resid.stream import AttnRecord, LayerRecord, MLPRecord, ResidualStream
from resid.tokenizer import Tokenizer, Tokens

__version__ = "0.1.0"

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
    "identity",
    "keep_freed_memory",
    "known_models",
    "load",
]
