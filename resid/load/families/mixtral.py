"""Mixtral (Jiang et al. 2024, "Mixtral of Experts"): Llama's attention, norms and embeddings with each MLP a
sparse mixture of experts (resid.components.moe): a router `gate` [expert d_model] and n_experts SwiGLU
experts, each chosen token routed to the top num_experts_per_tok of them.

Trap: the expert names are not Llama's. w1 is the gate branch (act applied), w3 the linear up branch, w2 the
down projection; resid's names are W_gate, W_in and W_out, stacked over experts ([expert ...]).
Hugging Face checkpoints keep one tensor per expert (`experts.E.w1.weight`), even where transformers 5 fuses
them in memory (gate_up_proj); this table reads the checkpoint names.
"""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer

FIELDS = llama.FIELDS | {"num_local_experts", "num_experts_per_tok"}
DENSE_MLP = ("blocks.{layer}.mlp.W_in", "blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.W_out")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(
        hf, architecture="mixtral", n_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"]
    )


def keys(config: ModelConfig) -> list[Key]:
    moe = "model.layers.{layer}.block_sparse_moe"
    table = [key for key in llama.table(config) if key.attribute not in DENSE_MLP]
    table.append(Key("blocks.{layer}.mlp.W_router", f"{moe}.gate.weight", "expert d_model -> d_model expert"))
    for e in range(config.n_experts):  # targets like blocks.{layer}.mlp.W_in.3: expert 3's [d_model d_mlp] view
        table += [
            Key(f"blocks.{{layer}}.mlp.W_gate.{e}", f"{moe}.experts.{e}.w1.weight", "d_mlp d_model -> d_model d_mlp"),
            Key(f"blocks.{{layer}}.mlp.W_in.{e}", f"{moe}.experts.{e}.w3.weight", "d_mlp d_model -> d_model d_mlp"),
            Key(f"blocks.{{layer}}.mlp.W_out.{e}", f"{moe}.experts.{e}.w2.weight", "d_model d_mlp -> d_mlp d_model"),
        ]
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("mixtral",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=FIELDS,
)
