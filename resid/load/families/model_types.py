"""model_type -> Family. The one list of architectures resid reads from Hugging Face folders."""

from pathlib import Path

from resid.errors import ResidError
from resid.load.families import (
    Family,
    arcee,
    bert,
    cohere,
    deepseek,
    ernie4_5,
    exaone4,
    gemma,
    gemma2,
    glm,
    glm4_moe,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gptj,
    granite,
    helium,
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
    glm4_moe.FAMILY,
)


def supported_model_types() -> list[str]:
    return sorted(t for family in FAMILIES for t in family.model_types)


def family_for(model_type: object, folder: Path) -> Family:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise ResidError(
        f"{folder}/config.json has model_type {model_type!r}, which resid does not support. Supported model "
        f"types: {', '.join(supported_model_types())}."
    )
