"""One Transformer block. Sequential (pre-norm):

    resid_mid  = resid_pre + attn(ln_attn(resid_pre))
    resid_post = resid_mid + mlp(ln_mlp(resid_mid))

Parallel (GPT-NeoX, GPT-J): both sublayers read resid_pre, and there is no resid_mid:

    resid_post = resid_pre + attn(ln_attn(resid_pre)) + mlp(ln_mlp(resid_pre))
"""

from collections.abc import Sequence

from jaxtyping import Float
from torch import Tensor, nn

from resid.components.attention import Attention, AttnContext
from resid.components.mlp import MLP
from resid.components.norm import Norm
from resid.config import ModelConfig
from resid.interventions import Edit


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.parallel = config.block == "parallel"
        self.ln_attn = Norm(config)
        self.attn = Attention(config, layer)
        self.ln_mlp = Norm(config)
        self.mlp = MLP(config, layer)

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        ctx: AttnContext,
        want_attn: frozenset[str],
        want_mlp: frozenset[str],
        edits_attn: Sequence[Edit] = (),
        edits_mlp: Sequence[Edit] = (),
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, Tensor], dict[str, Tensor]]:
        attn_in, attn_scale = self.ln_attn(resid_pre)
        attn_out, attn_values = self.attn(attn_in, ctx, want_attn, edits_attn)
        mlp_reads = resid_pre if self.parallel else resid_pre + attn_out
        mlp_in, mlp_scale = self.ln_mlp(mlp_reads)
        mlp_out, mlp_values = self.mlp(mlp_in, want_mlp, edits_mlp)
        resid_post = (resid_pre + attn_out if self.parallel else mlp_reads) + mlp_out
        for values, normalized, scale, want in (
            (attn_values, attn_in, attn_scale, want_attn),
            (mlp_values, mlp_in, mlp_scale, want_mlp),
        ):
            if "normalized" in want:
                values["normalized"] = normalized
            if "norm_scale" in want:
                values["norm_scale"] = scale
        return resid_post, attn_values, mlp_values
