"""Spec.transcoder: which hook a transcoder reads, and that a splice of it is accepted and exact."""

import torch
from random_models import make_random_model

from resid.analyses.training.loop import Spec
from resid.dictionaries import Dictionary, Splice, check


def _random_transcoder(model, spec: Spec) -> Dictionary:
    g = torch.Generator().manual_seed(0)
    d, n = model.config.d_model, 48
    return check(Dictionary(W_enc=torch.randn(d, n, generator=g) / d**0.5, b_enc=torch.zeros(n),
                            W_dec=torch.randn(n, d, generator=g) / n**0.5, b_dec=torch.zeros(d), activation="relu",
                            hook_in=spec.hook_in, hook_out=spec.hook_out, name=spec.label), model)


def test_a_transcoder_reads_the_standardized_input_unless_a_gain_has_a_zero_entry() -> None:
    model = make_random_model("gemma3_like")
    assert Spec.transcoder(model, 0).hook_in == "blocks.0.ln2.hook_normalized"
    with torch.no_grad():
        model.blocks[1].ln_mlp.w[3] = -1.0  # Gemma's stored gain is 1 + w: this entry of the gain is zero
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    assert [s.hook_in for s in specs] == [f"blocks.{l}.mlp.hook_in" for l in range(model.config.n_layers)]
    ids = torch.tensor([[1, 5, 9, 2, 7, 11]])
    plain = model.run(ids).logits
    spliced = model.run(ids, dictionaries=[Splice(_random_transcoder(model, s)) for s in specs]).logits
    torch.testing.assert_close(spliced, plain, atol=1e-4, rtol=1e-4)  # reconstruction + error: the plain run


def test_no_pre_norms_reads_the_residual() -> None:
    model = make_random_model("olmo2_like")
    assert Spec.transcoder(model, 1).hook_in == "blocks.1.hook_mlp_in"
