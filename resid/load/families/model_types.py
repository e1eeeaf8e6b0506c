"""model_type -> Family. The one list of architectures resid reads from Hugging Face folders."""

from pathlib import Path

from resid.errors import ResidError
from resid.load.families import (
    Family,
    apertus,
    arcee,
    bert,
    cohere,
    deepseek,
    ernie4_5,
    exaone4,
    falcon,
    gemma,
    gemma2,
    glm,
    glm4_moe,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gpt_oss,
    gptj,
    granite,
    helium,
    hunyuan,
    llama,
    marian,
    ministral,
    mixtral,
    nemotron,
    olmo,
    olmo2,
    olmo3,
    opt,
    phi,
    phi3,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    seed_oss,
    smollm3,
    stablelm,
    starcoder2,
    t5,
)

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY, gpt2.FAMILY, gpt_neox.FAMILY, gemma.FAMILY, qwen3.FAMILY, gemma2.FAMILY, phi3.FAMILY, olmo2.FAMILY,
    mixtral.FAMILY, deepseek.FAMILY, bert.FAMILY, marian.FAMILY, t5.FAMILY,
    # issue 58: the decoder families researchers use
    olmo3.FAMILY, seed_oss.FAMILY, smollm3.FAMILY, exaone4.FAMILY, granite.FAMILY, cohere.FAMILY, ernie4_5.FAMILY,
    starcoder2.FAMILY, stablelm.FAMILY, phi.FAMILY, gptj.FAMILY, opt.FAMILY, helium.FAMILY, glm.FAMILY, arcee.FAMILY,
    ministral.FAMILY, olmo.FAMILY, nemotron.FAMILY, gpt_bigcode.FAMILY, gpt_neo.FAMILY, qwen3_moe.FAMILY,
    glm4_moe.FAMILY, falcon.FAMILY, hunyuan.FAMILY, apertus.FAMILY, qwen2_moe.FAMILY, gpt_oss.FAMILY,
)


# Decoder families transformers has and resid does not compute, with the part that is missing: asked for one, the
# loader names it instead of only listing what is supported.
UNSUPPORTED = {
    "llama4_text": "chunked local attention, a weightless L2 norm of q and k on its rotary layers, attention "
                   "temperature tuning on its NoPE layers, and mixtures with a top-1 sigmoid router that scales the "
                   "expert's input",
    "llama4": "Llama 4's chunked attention, L2 q/k norm, temperature tuning and input-scaled experts (and a vision "
              "tower)",
    "gemma4_text": "per-layer input embeddings (hidden_size_per_layer_input), a learned per-layer output scalar and an "
                   "optional mixture beside each MLP",
    "gemma4": "Gemma 4's per-layer input embeddings, layer scalars and mixtures (and a vision and audio tower)",
    "qwen3_next": "gated DeltaNet linear-attention layers (a recurrent state, not a softmax pattern) and gated "
                  "attention outputs",
    "qwen3_5_text": "gated DeltaNet linear-attention layers and gated attention outputs",
    "bloom": "ALiBi position biases (a per-head linear penalty on distance, no position embedding)",
    "mpt": "ALiBi position biases",
    "phimoe": "sparsemixer routing",
    "mamba": "state-space (selective scan) layers instead of attention",
    "mamba2": "state-space (selective scan) layers instead of attention",
    "falcon_mamba": "state-space (selective scan) layers instead of attention",
    "jamba": "interleaved state-space (Mamba) layers",
    "zamba": "interleaved state-space (Mamba) layers",
    "zamba2": "interleaved state-space (Mamba) layers",
    "bamba": "interleaved state-space (Mamba) layers",
    "falcon_h1": "parallel state-space (Mamba) heads",
    "granitemoehybrid": "interleaved state-space (Mamba) layers",
    "nemotron_h": "interleaved state-space (Mamba) layers",
    "lfm2": "short gated convolution layers",
    "recurrent_gemma": "RG-LRU recurrent layers",
    "rwkv": "RWKV time-mixing recurrences instead of attention",
    "xlstm": "xLSTM recurrent cells instead of attention",
    "minimax": "lightning (linear) attention layers",
    "gemma3n": "per-layer input embeddings, AltUp and Laurel blocks",
}


def supported_model_types() -> list[str]:
    return sorted(t for family in FAMILIES for t in family.model_types)


def family_for(model_type: object, folder: Path) -> Family:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    missing = f" resid does not compute its {UNSUPPORTED[model_type]}." if model_type in UNSUPPORTED else ""
    raise ResidError(
        f"{folder}/config.json has model_type {model_type!r}, which resid does not support.{missing} Supported "
        f"model types: {', '.join(supported_model_types())}."
    )
