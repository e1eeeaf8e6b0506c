"""A cross-layer transcoder in a run (resid.dictionaries.crosslayer_run): observing changes no logit and records
what clt.encode / clt.decode give on the run's own tensors; splicing with the error term keeps the clean run;
splicing without it equals hand-written hooks that encode each layer's MLP input and replace each MLP write by
the sum of every earlier layer's feature writes; `written` decomposes each reconstruction by source layer."""

import pytest
import torch
from numerics import TINY

import resid
from resid.dictionaries import CrossLayerTranscoder, Splice, check


def random_clt(model, d_sae: int = 24, seed: int = 0) -> CrossLayerTranscoder:
    if model.name.removeprefix("random-") not in FAMILIES:
        pytest.skip("the CLT's hooks are checked on a few unlike families")
    g = torch.Generator().manual_seed(seed)
    n, d = model.config.n_layers, model.config.d_model
    clt = CrossLayerTranscoder(
        W_enc=torch.randn(n, d, d_sae, generator=g) / d**0.5, b_enc=-0.3 * torch.rand(n, d_sae, generator=g),
        W_dec=[torch.randn(d_sae, n - l, d, generator=g) / d_sae**0.5 for l in range(n)],
        b_dec=0.1 * torch.randn(n, d, generator=g), activation="relu", hook_in="hook_mlp_in",
        hook_out="hook_mlp_out", name="clt")
    return check(clt, model)


FAMILIES = ("llama_gqa", "gemma3_like", "neox_parallel", "gpt2_like")  # pre-, sandwich-norm, parallel, biases
PROMPTS = ["When Mary and John went to the store, John gave a drink to", "The cat sat on the"]


def test_observing_a_clt_changes_nothing_and_records_its_decomposition(random_model) -> None:
    model = random_model
    clt = random_clt(model)
    plain = model.run(PROMPTS, capture=resid.Capture.all())
    run = model.run(PROMPTS, capture=resid.Capture.all(), dictionaries=[clt])
    assert torch.equal(run.logits, plain.logits)
    record = run.dictionaries["clt"]
    x = torch.stack([plain.read(point.site) for point in clt.points_in])
    acts = torch.relu(torch.einsum("lbpd,ldf->lbpf", x, clt.W_enc) + clt.b_enc[:, None, None])
    acts = acts * plain.tokens.attention_mask[None, ..., None]  # 0 at padding, as the attention mask says
    torch.testing.assert_close(record.acts, acts, **TINY)
    for t in range(model.config.n_layers):
        write = plain.read(resid.Site(t, "mlp"))
        torch.testing.assert_close(record.reconstruction[t] + record.error[t], write, **TINY)
        by_source = sum(record.written(l, t) for l in range(t + 1)) + clt.b_dec[t]
        torch.testing.assert_close(by_source, record.reconstruction[t], **TINY)
    with pytest.raises(resid.ResidError, match="write into layers"):
        record.written(1, 0)


def test_splicing_a_clt_with_its_error_keeps_the_run(random_model) -> None:
    model = random_model
    clt = random_clt(model)
    plain = model.run(PROMPTS)
    run = model.run(PROMPTS, dictionaries=[Splice(clt)])
    torch.testing.assert_close(run.logits, plain.logits, **TINY)
    record = run.dictionaries["clt"]
    assert record.mode == "splice" and record.acts.shape[:2] == (model.config.n_layers, len(PROMPTS))


def test_splicing_a_clt_without_its_error_equals_hand_written_hooks(random_model) -> None:
    model = random_model
    clt = random_clt(model)
    acts: list[torch.Tensor] = []

    def tap(l: int):
        def fn(x, tokens):
            acts.append(torch.relu(x @ clt.W_enc[l] + clt.b_enc[l]) * tokens.attention_mask[..., None])
            return x
        return fn

    def replace(t: int):
        def fn(x, tokens):
            return (clt.b_dec[t] + sum(acts[l] @ clt.W_dec[l][:, t - l] for l in range(t + 1))).to(x.dtype)
        return fn

    hooks = [h for l, p in enumerate(clt.points_in) for h in (resid.Hook(p.site, tap(l)),
                                                             resid.Hook(resid.Site(l, "mlp"), replace(l)))]
    expected = model.run(PROMPTS, interventions=hooks).logits
    run = model.run(PROMPTS, dictionaries=[Splice(clt, error=False)])
    torch.testing.assert_close(run.logits, expected, **TINY)
    assert run.dictionaries["clt"].mode == "reconstruction"
    torch.testing.assert_close(run.dictionaries["clt"].acts, torch.stack(acts), **TINY)


def test_a_clt_refuses_edits(random_model) -> None:
    clt = random_clt(random_model)
    with pytest.raises(resid.ResidError, match="edits per-layer dictionaries only"):
        random_model.run(PROMPTS, dictionaries=[Splice(clt, edit=lambda a, t: a)])
