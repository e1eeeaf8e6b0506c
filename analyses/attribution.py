"""Direct logit attribution: how much each write into the residual stream adds to one logit (difference).

With the final norm's scale frozen from the forward pass (analyses.directions), the logit of `target` (minus
`baseline`) at a position is linear in the final residual, which is the sum of every write. So

    logit = sum over components c of (c . u') + bias term

holds exactly, component by component, at three levels of detail:

    sublayer   embed, pos_embed (learned positions only), layers[l].attn.out, layers[l].mlp.out
    head       attention split into heads, z[h] @ (W_O[h] @ u'), plus the layer's output bias b_O
    neuron     heads as above, and each MLP split into neurons, post[i] * (W_out[i] . u'), plus b_out

and one `final_bias` row: the final norm's bias and the unembedding bias, projected (zero for models with
neither). Heads and neurons are computed projected, never materializing [batch pos head d_model], and only
the attributed position is captured. Projections run in float32 whatever the model dtype.
"""

from collections.abc import Sequence

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from analyses.io import provenance
from analyses.directions import logit_direction
from analyses.prompts import as_prompt_list, batch_size_for, input_tokens, padded_index, prompt_positions
from analyses.vocab import Token, decode_ids, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer
from resid.stream import ResidualStream

LEVELS = ("sublayer", "head", "neuron")


@torch.no_grad()
def direct(
    model: Transformer,
    prompts: str | Sequence[str],
    target: Token | Sequence[Token] | None = None,
    baseline: Token | Sequence[Token] | None = None,
    level: str = "sublayer",
    pos: int = -1,
    batch_size: int | str = "auto",
) -> pd.DataFrame:
    """Direct attribution of the logit of `target` (minus `baseline`) at prompt position `pos`.

    target / baseline: one token (string or id) for all prompts, or one per prompt; target=None takes the
    model's top prediction at `pos`. One row per (prompt, component), in logit units:
    prompt_idx pos token target target_id baseline baseline_id component layer part head neuron value logit,
    where `logit` is the model's own logit (difference), which each prompt's `value`s sum to."""
    if level not in LEVELS:
        raise ResidError(f"level must be one of {LEVELS}, got {level!r}.")
    texts = as_prompt_list(prompts)
    n = len(texts)
    targets = None if target is None else token_ids(model, target, n, "target")
    baselines = None if baseline is None else token_ids(model, baseline, n, "baseline")
    frames = []
    chunks = run_batched(
        list(range(n)),
        lambda chunk: _attribute(model, texts, chunk, targets, baselines, level, pos),
        batch_size_for(model, texts, batch_size),
    )
    for _, frame in chunks:
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    df.attrs["provenance"] = provenance.describe(
        model, "attribution.direct", {"level": level, "pos": pos}, texts, target, baseline
    )
    return df


def metric_name(df: pd.DataFrame) -> str:
    """What the rows of `df` attribute, e.g. "logit(' Mary') - logit(' John')" ("the target" when the
    prompts have different ones)."""
    targets = df["target"].unique()
    target = repr(targets[0]) if len(targets) == 1 else "the target"
    baselines = df["baseline"].dropna().unique()
    if len(baselines) == 1:
        return f"logit({target}) - logit({baselines[0]!r})"
    return f"logit({target})" + (" - logit(baseline)" if len(baselines) else "")


def top_components(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """The n rows with the largest |value|, largest first."""
    return df.reindex(df["value"].abs().sort_values(ascending=False).index).head(n)


def _attribute(
    model: Transformer,
    texts: list[str],
    chunk: Sequence[int],
    targets: list[int] | None,
    baselines: list[int] | None,
    level: str,
    pos: int,
) -> pd.DataFrame:
    tokens = model.to_tokens([texts[i] for i in chunk])
    rel = prompt_positions(tokens.lengths.tolist(), [pos])
    index = padded_index(tokens, rel)  # [batch 1]
    kept = sorted(set(index[:, 0].tolist()))
    capture = Capture(  # heads need z, neurons post; whole sublayers their write
        positions=kept,
        attn={"z"} if level != "sublayer" else {"out"},
        mlp={"post"} if level == "neuron" else {"out"},
    )
    run = model.run(tokens, capture=capture, logits_at=index)
    column = torch.tensor([kept.index(p) for p in index[:, 0].tolist()], device=model.device)
    rows = torch.arange(len(chunk), device=model.device)
    logits = run.logits[:, 0].float()
    target_list = logits.argmax(-1).tolist() if targets is None else [targets[i] for i in chunk]
    baseline_list = None if baselines is None else [baselines[i] for i in chunk]
    stream = run.stream
    direction = logit_direction(model, target_list, stream.final_norm_scale[rows, column], baseline_list)
    actual = logits[rows, torch.tensor(target_list, device=model.device)]
    if baseline_list is not None:
        actual = actual - logits[rows, torch.tensor(baseline_list, device=model.device)]
    blocks = _components(model, stream, rows, column, direction.direction, level)
    blocks.append(_Block(["final_bias"], None, "bias", None, None, direction.bias[:, None]))
    meta = {
        "prompt_idx": list(chunk),
        "pos": [r[0] for r in rel],
        "token": [t[0] for t in input_tokens(model, tokens, index)],
        "target": list(decode_ids(model, np.array(target_list))),
        "target_id": target_list,
        "baseline": [None] * len(chunk) if baseline_list is None else list(decode_ids(model, np.array(baseline_list))),
        "baseline_id": pd.array([None] * len(chunk) if baseline_list is None else baseline_list, dtype="Int64"),
    }
    return _frame(meta, blocks, actual)


class _Block:
    """Contributions of a group of components: labels, their layer/part/head/neuron, values [batch m]."""

    def __init__(self, labels, layer, part, heads, neurons, values: Float[Tensor, "batch m"]):
        self.labels, self.layer, self.part, self.heads, self.neurons, self.values = (
            labels, layer, part, heads, neurons, values
        )


def _components(
    model: Transformer,
    stream: ResidualStream,
    rows: Tensor,
    column: Tensor,
    u: Float[Tensor, "batch d_model"],
    level: str,
) -> list[_Block]:
    def dot(write: Tensor) -> Tensor:  # [batch kept d_model] -> [batch 1]
        return (write[rows, column].float() * u).sum(-1, keepdim=True)

    blocks = [_Block(["embed"], None, "embed", None, None, dot(stream.embed))]
    if stream.pos_embed is not None:
        blocks.append(_Block(["pos_embed"], None, "embed", None, None, dot(stream.pos_embed)))
    for layer, record in enumerate(stream.layers):
        attn, mlp = model.blocks[layer].attn, model.blocks[layer].mlp
        if level == "sublayer":
            blocks.append(_Block([f"layers[{layer}].attn.out"], layer, "attn", None, None, dot(record.attn.out)))
        else:
            # z[h] @ (W_O[h] @ u'): project W_O onto the direction first, a [batch head d_head] tensor.
            w_o_u = einops.einsum(attn.W_O.float(), u, "head d_head d_model, batch d_model -> batch head d_head")
            z = record.attn.z[rows, column].float()
            heads = einops.einsum(z, w_o_u, "batch head d_head, batch head d_head -> batch head")
            n_heads = heads.shape[1]
            labels = [f"layers[{layer}].attn.head[{h}]" for h in range(n_heads)]
            blocks.append(_Block(labels, layer, "attn", np.arange(n_heads), None, heads))
            if attn.b_O is not None:
                bias = (attn.b_O.float() @ u.T)[:, None]
                blocks.append(_Block([f"layers[{layer}].attn.b_O"], layer, "attn", None, None, bias))
        if level != "neuron":
            blocks.append(_Block([f"layers[{layer}].mlp.out"], layer, "mlp", None, None, dot(record.mlp.out)))
            continue
        # post[i] * (W_out[i] . u')
        neurons = record.mlp.post[rows, column].float() * (u @ mlp.W_out.float().T)
        d_mlp = neurons.shape[1]
        labels = [f"layers[{layer}].mlp.neuron[{i}]" for i in range(d_mlp)]
        blocks.append(_Block(labels, layer, "mlp", None, np.arange(d_mlp), neurons))
        if mlp.b_out is not None:
            bias = (mlp.b_out.float() @ u.T)[:, None]
            blocks.append(_Block([f"layers[{layer}].mlp.b_out"], layer, "mlp", None, None, bias))
    return blocks


def _frame(meta: dict, blocks: list[_Block], actual: Float[Tensor, "batch"]) -> pd.DataFrame:
    """Long format: every prompt of the chunk times every component."""

    def per_component(block: _Block, values, fill) -> np.ndarray:
        m = len(block.labels)
        return np.full(m, fill, dtype=object) if values is None else np.asarray(values, dtype=object)

    labels = np.concatenate([np.asarray(b.labels, dtype=object) for b in blocks])
    layer = np.concatenate([per_component(b, None, b.layer) for b in blocks])
    part = np.concatenate([per_component(b, None, b.part) for b in blocks])
    head = np.concatenate([per_component(b, b.heads, None) for b in blocks])
    neuron = np.concatenate([per_component(b, b.neurons, None) for b in blocks])
    values = torch.cat([b.values for b in blocks], dim=1).double().cpu().numpy()  # [batch m]
    batch, m = values.shape
    df = pd.DataFrame({name: np.repeat(np.asarray(col, dtype=object), m) for name, col in meta.items()})
    for name in ("prompt_idx", "pos", "target_id"):
        df[name] = df[name].astype("int64")
    df["baseline_id"] = df["baseline_id"].astype("Int64")
    df["target"] = df["target"].astype(str)
    df["token"] = df["token"].astype(str)
    df["component"] = np.tile(labels, batch).astype(str)
    df["layer"] = pd.array(np.tile(layer, batch), dtype="Int64")
    df["part"] = np.tile(part, batch).astype(str)
    df["head"] = pd.array(np.tile(head, batch), dtype="Int64")
    df["neuron"] = pd.array(np.tile(neuron, batch), dtype="Int64")
    df["value"] = values.reshape(-1)
    df["logit"] = np.repeat(actual.double().cpu().numpy(), m)
    return df
