"""A sparse mixture-of-experts MLP (Mixtral; Jiang et al. 2024, "Mixtral of Experts"; DeepSeek-V2/V3, Dai et al.
2024, "DeepSeekMoE"), as transformers' MixtralSparseMoeBlock and DeepseekV2Moe / DeepseekV3MoE compute it.
Glossary: `expert` is the expert axis (n_experts of them); each expert is a gated MLP of width d_mlp with its own
keys, values and coefficients (resid.components.mlp). The first n_experts - n_shared_experts are *routed*; the
last n_shared_experts are *shared*: every token reads them with weight 1 (DeepSeek keeps them as one MLP of
n_shared_experts * d_mlp neurons, which is their sum, split by neurons).

    router_logits  = x W_router (+ b_router: gpt-oss)    [routed expert]
    scores         = softmax(router_logits) (Mixtral, DeepSeek V2) or sigmoid (V3), in float32
    choice         = scores + router_bias (V3's e_score_correction_bias: it chooses, it does not weigh)
    groups         (router_groups > 1) the routed experts in equal groups, each scored by its best choice ("max",
                   V2) or the sum of its two best ("top2", V3); a token chooses among its router_topk_groups best
    top-k of choice; their scores, renormalized to sum to 1 (router_renormalize), times router_scale, are the
                   `expert_weights` (0 for the other routed experts, 1 for the shared ones, or with
                   shared_expert_gate sigmoid(x W_shared_gate) for every shared one: Qwen2 MoE), cast to the model
                   dtype (as transformers does before weighting the experts)
    post_e         = act(x W_gate[e]) * (x W_in[e])      expert e's coefficients (w1 = gate, w3 = up); gpt-oss: its
                   clamped SwiGLU of the two, with biases b_gate[e], b_in[e] (resid.components.clamped_glu)
    out            = sum over e of expert_weights[e] * (post_e W_out[e] (+ b_out[e]))   (w2 = down)

So the experts' writes (shared ones included) sum to the MLP's write.

Each expert runs on the tokens routed to it only (an index per expert), so the cost is k/n_experts of a dense
evaluation of every expert. `post` and `expert_out` are zero for the experts a token was not routed to.

Interventions: an expert's write (Site(expert=e)) is expert_weights[e] * post_e W_out[e], edited before the
experts are summed; an expert neuron's coefficient (Site(expert=e, neuron=i)) is post_e[i], edited before
W_out[e] and the weight. A token not routed to e has weight 0, so editing post_e there changes nothing;
ZeroAblate of an expert's write removes it without renormalizing the other experts' weights.

The weights are stored privately, stacked over experts in torch's linear layout; W_router, W_in, W_gate and
W_out are their one public name, as views.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.components.clamped_glu import clamped_swiglu
from resid.components.mlp import ACTIVATIONS
from resid.config import ModelConfig
from resid.interventions import Edit, apply_edits


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        clamped = config.act == "clamped_swiglu"  # gpt-oss: both branches clamped, a shifted linear branch
        self.act = None if clamped else ACTIVATIONS[config.act]
        self.glu = (config.glu_limit, config.glu_alpha) if clamped else None
        self.n_experts = config.n_experts
        self.n_routed = config.n_experts - config.n_shared_experts
        self.top_k = config.experts_per_token
        self.scores = config.router
        self.renormalize, self.scale = config.router_renormalize, config.router_scale
        self.groups, self.topk_groups = config.router_groups, config.router_topk_groups
        self.group_score = config.router_group_score
        n, d_mlp, d_model = config.n_experts, config.d_mlp, config.d_model
        self._w_router = nn.Parameter(torch.zeros(self.n_routed, d_model))
        self.router_bias = nn.Parameter(torch.zeros(self.n_routed)) if config.router_bias else None
        # Qwen2 MoE: the shared experts' weight, one sigmoid gate per token (1 without it)
        self._w_shared_gate = nn.Parameter(torch.zeros(1, d_model)) if config.shared_expert_gate else None
        self._w_in = nn.Parameter(torch.zeros(n, d_mlp, d_model))
        self._w_gate = nn.Parameter(torch.zeros(n, d_mlp, d_model))
        self._w_out = nn.Parameter(torch.zeros(n, d_model, d_mlp))
        bias = config.expert_bias  # gpt-oss: biases on every expert's three projections, and on the router's logits
        self.b_in = nn.Parameter(torch.zeros(n, d_mlp)) if bias else None
        self.b_gate = nn.Parameter(torch.zeros(n, d_mlp)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(n, d_model)) if bias else None
        self.b_router = nn.Parameter(torch.zeros(self.n_routed)) if config.router_logit_bias else None

    @property
    def W_router(self) -> Float[Tensor, "d_model routed"]:
        return self._w_router.T

    @property
    def W_shared_gate(self) -> Float[Tensor, "d_model 1"] | None:
        return None if self._w_shared_gate is None else self._w_shared_gate.T

    @property
    def W_in(self) -> Float[Tensor, "expert d_model d_mlp"]:
        return self._w_in.transpose(1, 2)

    @property
    def W_gate(self) -> Float[Tensor, "expert d_model d_mlp"]:
        return self._w_gate.transpose(1, 2)

    @property
    def W_out(self) -> Float[Tensor, "expert d_mlp d_model"]:
        return self._w_out.transpose(1, 2)

    def route(
        self, normalized: Float[Tensor, "batch pos d_model"]
    ) -> tuple[Float[Tensor, "batch pos routed"], Float[Tensor, "batch pos expert"]]:
        """(router logits, expert weights): the chosen experts' scores (renormalized, scaled), zero for the other
        routed experts, one for the shared ones (or their sigmoid gate), in the model dtype."""
        logits = F.linear(normalized, self._w_router, self.b_router)
        # float32, as transformers
        scores = torch.softmax(logits.float(), dim=-1) if self.scores == "softmax" else logits.float().sigmoid()
        choice = scores if self.router_bias is None else scores + self.router_bias.float()
        if self.groups > 1:
            grouped = choice.unflatten(-1, (self.groups, -1))  # [batch pos group expert_in_group]
            best = grouped.max(-1).values if self.group_score == "max" else grouped.topk(2, dim=-1).values.sum(-1)
            kept = torch.zeros_like(best, dtype=torch.bool).scatter(-1, best.topk(self.topk_groups, dim=-1)[1], True)
            choice = choice.masked_fill(~kept.repeat_interleave(grouped.shape[-1], dim=-1), float("-inf"))
        chosen = choice.topk(self.top_k, dim=-1)[1]
        top = scores.gather(-1, chosen)
        if self.renormalize:  # the 1e-20 of transformers' DeepSeek V3, no change to a float32 sum of k scores
            top = top / (top.sum(-1, keepdim=True) + 1e-20)
        top = top * self.scale if self.scale != 1.0 else top
        weights = torch.zeros_like(scores).scatter(-1, chosen, top)
        n_shared = self.n_experts - self.n_routed
        if self._w_shared_gate is None:
            shared = weights.new_ones(*weights.shape[:-1], n_shared)
        else:
            gate = torch.sigmoid(F.linear(normalized, self._w_shared_gate)).float()
            shared = gate.expand(*gate.shape[:-1], n_shared)
        return logits, torch.cat((weights, shared), dim=-1).to(normalized.dtype)

    def forward(
        self, normalized: Float[Tensor, "batch pos d_model"], want: frozenset[str], edits: Sequence[Edit]
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, Tensor]]:
        """The MoE output before any post-norm (the block applies that, and the whole-write edits)."""
        batch, n_pos, d_model = normalized.shape
        logits, weights = self.route(normalized)
        x = normalized.reshape(-1, d_model)  # [token d_model], token = batch * pos
        weight = weights.reshape(-1, self.n_experts)
        out = torch.zeros_like(x)
        post_all = x.new_zeros(x.shape[0], self.n_experts, self._w_in.shape[1]) if "post" in want else None
        expert_out = x.new_zeros(x.shape[0], self.n_experts, d_model) if "expert_out" in want else None
        for e in range(self.n_experts):
            mine = [edit for edit in edits if edit[0].site.expert == e]
            tokens = weight[:, e].nonzero()[:, 0]  # the tokens routed to e (index per expert)
            if tokens.numel() == 0 and not mine:
                continue
            x_e = x[tokens]
            post = self._post(x_e, e)
            if any(edit[0].site.what == "post" for edit in mine):
                full = _scatter(post, tokens, x.shape[0]).view(batch, n_pos, -1)
                post = apply_edits(full, mine, "post").reshape(x.shape[0], -1)[tokens]
            write = F.linear(post, self._w_out[e], None if self.b_out is None else self.b_out[e]) * weight[tokens, e,
                                                                                                          None]
            if post_all is not None:
                post_all[tokens, e] = post.to(post_all.dtype)  # bf16 under autocast, into the model's dtype
            if any(edit[0].site.what == "expert_out" for edit in mine):
                full = _scatter(write, tokens, x.shape[0]).view(batch, n_pos, d_model)
                full = apply_edits(full, mine, "expert_out").reshape(-1, d_model)
                out = out + full  # an edit may write where the expert was not routed
                if expert_out is not None:
                    expert_out[:, e] = full
                continue
            out.index_add_(0, tokens, write)
            if expert_out is not None:
                expert_out[tokens, e] = write.to(expert_out.dtype)
        values = {
            "router_logits": logits,
            "expert_weights": weights,
            "post": None if post_all is None else post_all.view(batch, n_pos, self.n_experts, -1),
            "expert_out": None if expert_out is None else expert_out.view(batch, n_pos, self.n_experts, d_model),
        }
        return out.view(batch, n_pos, d_model), {name: values[name] for name in want if values.get(name) is not None}


    def _post(self, x: Float[Tensor, "token d_model"], e: int) -> Float[Tensor, "token d_mlp"]:
        """Expert e's coefficients of the tokens `x`: act(x W_gate + b_gate) * (x W_in + b_in), or gpt-oss's
        clamped SwiGLU of the two."""
        gate = F.linear(x, self._w_gate[e], None if self.b_gate is None else self.b_gate[e])
        up = F.linear(x, self._w_in[e], None if self.b_in is None else self.b_in[e])
        return self.act(gate) * up if self.glu is None else clamped_swiglu(gate, up, *self.glu)


def _scatter(rows: Tensor, tokens: Tensor, n_tokens: int) -> Tensor:
    """[n_tokens width]: `rows` at `tokens`, zero elsewhere."""
    return rows.new_zeros(n_tokens, rows.shape[-1]).index_copy(0, tokens, rows)
