"""Text generation with a KV cache, interventions applied at every step (e.g. trying a steering vector).

    gen = model.generate("I think that", 20, interventions=[resid.Add(resid.Site(6, "attn"), vector)])
    gen.texts      # the new text of each prompt
    gen.new_ids    # [batch new]
    gen.tokens     # prompt + new tokens, as Tokens that model.run takes (same logits as each step's)

The prompt runs once through every layer, each layer keeping its keys (after rotary) and values in a
`KVCache`; each later step runs only the new token, which attends over the cache. Prompts are left-padded, so
every row's next token goes in the same column; its position id is the row's own count of real tokens.

Interventions: one with `positions=None` edits every position of the prompt and then each new token; one with
explicit (prompt-relative) positions edits those positions of the prompt only, never a generated token. A
`resid.Hook`'s fn sees the prompt's Tokens on the prompt's pass, then at each step the step's one-position
Tokens (the new token ids, their position ids).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from resid import forward
from resid.capture import Capture
from resid.components.kv_cache import KVCache
from resid.errors import ResidError
from resid.interventions import HookCall, Intervention, group_edits
from resid.run import Memory
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Generation:
    tokens: Tokens  # prompt + new tokens [batch prompt_pos + new]; after a row's eos, eos marked as padding
    new_ids: Int[Tensor, "batch new"]  # after a row's eos (stop_at_eos), eos again
    texts: list[str] | None  # the new text of each prompt (up to its eos, excluded); None without a tokenizer
    logits: Float[Tensor, "batch new d_vocab"] | None  # the logits each new token was chosen from (return_logits)


def generate(
    model: nn.Module,
    inputs,
    max_new_tokens: int,
    interventions: Sequence[Intervention] = (),
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | torch.Generator | None = None,
    stop_at_eos: bool = False,
    return_logits: bool = False,
    memory: Memory | None = None,
) -> Generation:
    """Continue each prompt by `max_new_tokens` tokens: the most likely one (do_sample=False) or one sampled from
    softmax(logits / temperature), over the top_k most likely only if top_k is given. `seed` (an int or a
    torch.Generator) makes sampling reproducible. With stop_at_eos, a row that produced the tokenizer's eos
    continues with eos, and generation ends early once every row has. `inputs` are what model.run takes; a
    batch must be left-padded. Interventions: see the module docstring. memory: for the decoder of an
    encoder-decoder model, the encoded source its cross-attention reads (resid.EncoderDecoder.generate passes
    it); its keys and values are computed once and cached with the rest."""
    tokens = model.as_tokens(inputs)
    eos = _check(model, tokens, max_new_tokens, do_sample, temperature, top_k, stop_at_eos, memory)
    generator = _generator(seed, model.device) if do_sample else None
    batch, n_prompt = tokens.ids.shape
    edits = group_edits(interventions, model.config, tokens)
    # After the prompt, only edits of every position remain: they apply to each new token.
    step_edits = {key: [(iv, index) for iv, index in group if index is None] for key, group in edits.items()}
    cache = KVCache.empty(model.config, batch, n_prompt + max_new_tokens, model.dtype, model.device)
    mask = torch.cat([tokens.attention_mask, tokens.attention_mask.new_ones(batch, max_new_tokens)], dim=1)
    position_ids = tokens.position_ids[:, -1:]  # left padding: the last column is every prompt's last token
    done = torch.zeros(batch, dtype=torch.bool, device=model.device)
    new_ids, step_logits = [], []
    with torch.no_grad():
        ctx = forward.context(model, tokens, memory, cache=cache)
        logits = forward.forward(model, tokens, edits, Capture.none(), None, ctx=ctx, logits_at="last").logits[:, 0]
        _check_finite(model, logits, tokens, edits, memory)
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # of every key, for a relative position bias
        for step in range(max_new_tokens):
            next_ids = _choose(logits, temperature, top_k, generator) if do_sample else logits.argmax(dim=-1)
            if eos is not None:
                next_ids = torch.where(done, eos, next_ids)
                done = done | (next_ids == eos)
            new_ids.append(next_ids)
            step_logits.append(logits if return_logits else None)
            if step == max_new_tokens - 1 or (eos is not None and bool(done.all())):
                break
            position_ids = position_ids + 1
            cfg, seen = model.config, mask[:, : n_prompt + step + 1]
            allowed = {kind: _allowed_last(seen, cfg.window(kind)) for kind in cfg.layer_types_used}
            logits = _step(model, next_ids[:, None], position_ids, allowed, cache, step_edits, memory,
                           positions[:, : n_prompt + step + 1])
            _check_finite(model, logits, _grown_tokens(tokens, torch.stack(new_ids, dim=1), None), edits, memory)
    new = torch.stack(new_ids, dim=1)
    return Generation(
        tokens=_grown_tokens(tokens, new, eos),
        new_ids=new,
        texts=_texts(model, new, eos),
        logits=torch.stack(step_logits, dim=1) if return_logits else None,
    )


def _check(model, tokens: Tokens, max_new_tokens: int, do_sample: bool, temperature: float, top_k, stop_at_eos,
           memory: Memory | None = None):
    """Validate the request; the eos id to stop at, or None."""
    config = model.config
    if config.cross_attention and memory is None:
        raise ResidError(f"{model.name}'s decoder reads a source: generate with the resid.EncoderDecoder, "
                         "model.generate(source, max_new_tokens=...), or pass memory=.")
    if memory is not None and not config.cross_attention:
        raise ResidError(f"memory= is the encoded source of an encoder-decoder model's decoder; {model.name} has no "
                         "cross-attention.")
    if memory is not None and memory.hidden.shape[0] != tokens.ids.shape[0]:
        raise ResidError(f"Got {memory.hidden.shape[0]} encoded sources for {tokens.ids.shape[0]} target prefixes: "
                         "generation pairs each target prefix with one source.")
    if not config.causal or config.head != "lm":
        what = "an encoder (bidirectional attention)" if not config.causal else "a model without an LM head"
        raise ResidError(
            f"generate() continues text with a causal language model; {model.name} is {what}. Read its predictions "
            "with model.run instead."
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ResidError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}.")
    n_prompt, n_ctx = tokens.ids.shape[1], model.config.n_ctx
    if n_prompt + max_new_tokens > n_ctx:
        raise ResidError(
            f"The prompt ({n_prompt} positions, padding included) plus max_new_tokens={max_new_tokens} exceeds "
            f"{model.name}'s context of {n_ctx}: ask for at most {n_ctx - n_prompt} new tokens, or shorten the prompt."
        )
    if not bool(tokens.attention_mask[:, -1].all()):
        raise ResidError(
            "generate needs left-padded prompts (new tokens go in one column after every prompt's last token): "
            "pass texts, or Tokens made with model.to_tokens(texts, padding_side='left')."
        )
    if do_sample and not temperature > 0:
        raise ResidError(
            f"temperature must be > 0 when sampling, got {temperature!r} (use do_sample=False for greedy)."
        )
    if do_sample and top_k is not None and not 1 <= top_k:
        raise ResidError(f"top_k must be a positive integer or None, got {top_k!r}.")
    if not stop_at_eos:
        return None
    eos = None if model.tokenizer is None else model.tokenizer.eos_token_id
    if eos is None:
        raise ResidError(
            f"stop_at_eos=True, but {model.name} has no tokenizer with an eos token: set stop_at_eos=False."
        )
    return eos


def _generator(seed: int | torch.Generator | None, device: torch.device) -> torch.Generator | None:
    if isinstance(seed, torch.Generator) and seed.device.type != device.type:
        raise ResidError(f"The generator is on {seed.device} and the model on {device}: sampling draws on the "
                         "model's device, so pass torch.Generator(device=model.device) or an int seed.")
    if seed is None or isinstance(seed, torch.Generator):
        return seed
    return torch.Generator(device=device).manual_seed(seed)


def sample_probs(
    logits: Float[Tensor, "batch d_vocab"], temperature: float, top_k: int | None
) -> Float[Tensor, "batch d_vocab"]:
    """The distribution a sampled token is drawn from: softmax(logits / temperature) over the top_k logits
    (ties at the k-th value kept), zero elsewhere. In float32 so that a half-precision model samples the same."""
    scaled = logits.float() / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def _choose(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    return torch.multinomial(sample_probs(logits, temperature, top_k), 1, generator=generator)[:, 0]


def _allowed_last(
    mask: Bool[Tensor, "batch key_pos"], sliding_window: int | None
) -> Bool[Tensor, "batch 1 1 key_pos"]:
    """Which keys the newest position (the last of `mask`) may read: real ones, within the sliding window, as
    allowed_keys gives for the last row of the whole sequence."""
    n = mask.shape[1]
    allowed = mask.clone()
    if sliding_window is not None:
        allowed[:, : max(n - sliding_window, 0)] = False
    allowed[:, -1] = True
    return allowed[:, None, None, :]


def _step(model, ids: Tensor, position_ids: Tensor, allowed: dict[str, Tensor], cache: KVCache, edits: dict,
          memory: Memory | None = None, key_positions: Tensor | None = None) -> Tensor:
    """Logits [batch d_vocab] after one new position per row, reading the earlier ones from the cache."""
    step = Tokens(ids, torch.ones_like(ids, dtype=torch.bool), position_ids)
    # The step's own mask would let it see only itself; it reads the cached keys through `allowed`.
    ctx = forward.context(model, step, memory, cache=cache, allowed=allowed, key_positions=key_positions)
    # A Hook was bound to the prompt's Tokens by `group_edits`; at this step it edits (and is told about) the new token.
    edits = {key: [(HookCall(iv.hook, step) if isinstance(iv, HookCall) else iv, index) for iv, index in group]
             for key, group in edits.items()}
    return forward.forward(model, step, edits, Capture.none(), None, ctx=ctx).logits[:, 0]


def _check_finite(model, logits: Tensor, tokens: Tokens, edits: dict, memory: Memory | None = None) -> None:
    """Non-finite logits are the error `Transformer.run` gives, naming the first non-finite site: found by a
    pass over the prompt and the tokens so far without the cache (the prompt's edits keep their padded indices,
    since new tokens only follow the prompt)."""
    if bool(torch.isfinite(logits).all()):
        return
    ctx = None if memory is None else forward.context(model, tokens, memory)
    where = forward.first_nonfinite(model, tokens, edits, ctx=ctx)
    raise ResidError(f"generate produced NaN or infinite logits; the first non-finite site is {where}. Check the "
                     "interventions' values, or load the model in float32 if it is in half precision.")


def _grown_tokens(tokens: Tokens, new: Tensor, eos: int | None) -> Tokens:
    ids = torch.cat([tokens.ids, new], dim=1)
    real_new = torch.ones_like(new, dtype=torch.bool)
    if eos is not None:
        # Real up to and including each row's first eos; the eos repeated after it is padding.
        is_eos = (new == eos).long()
        real_new = (is_eos.cumsum(dim=1) - is_eos) == 0
    mask = torch.cat([tokens.attention_mask, real_new], dim=1)
    return Tokens(ids, mask, (mask.long().cumsum(dim=1) - 1).clamp(min=0))


def _texts(model, new: Tensor, eos: int | None) -> list[str] | None:
    if model.tokenizer is None:
        return None
    texts = []
    for row in new.tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos)]
        texts.append(model.tokenizer.decode(row))
    return texts
