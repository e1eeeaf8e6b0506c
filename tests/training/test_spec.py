"""Spec.transcoder: which Site a transcoder reads (and under which TransformerLens hook it is saved), and that a
splice of it is accepted and exact; Specs from strings."""

import pytest
import torch
from random_models import make_random_model

from resid.analyses.training.loop import Spec
from resid.dictionaries import Binding, Dictionary, Splice, Weights, check
from resid.dictionaries.hooks import point_of
from resid.errors import ResidError
from resid.sites import Site


def _random_transcoder(model, spec: Spec) -> Dictionary:
    g = torch.Generator().manual_seed(0)
    d, n = model.config.d_model, 48
    point_in, point_out = spec.points(model)
    W_enc, W_dec = torch.randn(d, n, generator=g) / d**0.5, torch.randn(n, d, generator=g) / n**0.5
    return check(Dictionary(Weights(W_enc, W_dec, torch.zeros(d), torch.zeros(n)),
                            binding=Binding(point_in.name, point_out.name), name=point_in.name), model)


def test_a_transcoder_reads_the_standardized_input_unless_a_gain_has_a_zero_entry() -> None:
    model = make_random_model("gemma3_like")
    spec = Spec.transcoder(model, 0)
    assert spec.site_in == point_of(Site(0, "mlp", field="normalized"), model.config, standardized=True)
    assert (spec.reads, spec.site_in.standardized, spec.site_out) == (Site(0, "mlp", field="normalized"), True,
                                                                      Site(0, "mlp"))
    assert [p.name for p in spec.points(model)] == ["blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"]
    with torch.no_grad():
        model.blocks[1].ln_mlp.w[3] = -1.0  # Gemma's stored gain is 1 + w: this entry of the gain is zero
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    assert all(s.site_in == Site(s.reads.layer, "mlp", field="normalized") for s in specs)  # after the gain
    assert [s.points(model)[0].name for s in specs] == [f"blocks.{l}.mlp.hook_in" for l in range(model.config.n_layers)]
    ids = torch.tensor([[1, 5, 9, 2, 7, 11]])
    plain = model.run(ids).logits
    spliced = model.run(ids, dictionaries=[Splice(_random_transcoder(model, s)) for s in specs]).logits
    torch.testing.assert_close(spliced, plain, atol=1e-4, rtol=1e-4)  # reconstruction + error: the plain run


def test_no_pre_norms_reads_the_residual() -> None:
    model = make_random_model("olmo2_like")
    spec = Spec.transcoder(model, 1)
    assert spec.site_in == Site(1, "resid_mid")
    assert spec.points(model)[0].name == "blocks.1.hook_resid_mid"


def test_strings_are_site_labels_or_hook_names_and_standardized_needs_a_norm_output() -> None:
    model = make_random_model("llama_gqa")
    assert Spec("layers[-1].resid_post") == Spec("blocks.-1.hook_resid_post") == Spec(Site(-1, "resid_post"))
    assert Spec("layers[-1].resid_post").points(model)[0].site == Site(model.config.n_layers - 1, "resid_post")
    with pytest.raises(ResidError, match=r"standardized \(before a norm's gain"):
        point_of(Site(1, "resid_post"), model.config, standardized=True)
    standardized = Spec("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out")  # a hook name keeps what it reads
    assert standardized.site_in.standardized and standardized.reads == Site(1, "mlp", field="normalized")
    assert standardized.points(model)[0].name == "blocks.1.ln2.hook_normalized"


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "olmo2_like", "gpt2_like"])
def test_every_spec_parses_back_from_what_a_checkpoint_records(kind) -> None:
    model = make_random_model(kind)
    specs = [Spec(Site(0, "resid_post")), Spec("blocks.1.hook_mlp_out"), Spec(Site(1, "attn", field="z")),
             *(Spec.transcoder(model, layer, skip=layer == 0) for layer in range(model.config.n_layers))]
    for spec in specs:
        recorded = spec.settings()
        parsed_in = Site.parse(recorded["site_in"])
        assert parsed_in == spec.reads and parsed_in.label == recorded["site_in"]
        if spec.site_out is not None:
            assert Site.parse(recorded["site_out"]) == spec.site_out
        read_in = point_of(parsed_in, model.config, standardized=True) if recorded["standardized"] else parsed_in
        assert Spec(read_in, None if spec.site_out is None else Site.parse(recorded["site_out"]),
                    recorded["skip"]).points(model) == spec.points(model)
