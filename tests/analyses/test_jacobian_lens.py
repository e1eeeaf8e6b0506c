"""The Jacobian lens (J-lens): resid's fit equals TransformerLens 4.3's (tests/data/jlens, made by
tests/data/make_jlens_reference.py in TransformerLens's own environment) on a tiny random Llama; the reference's file
read by resid gives TransformerLens's readout; on SmolLM2's first three layers (from the GGUF resid reads, dequantized
by transformers for TransformerLens) the fit and its readout equal TransformerLens's too; J = I is the logit lens
exactly; the fit equals the brute-force expected Jacobian on soft-capped, post-norm and parallel families, whatever
the batch and block; a checkpoint resumes; a frozen J-lens logit is a sum of writes through J^T v; the interventions
act in lens coordinates as said; both layouts round-trip."""

from pathlib import Path

import pytest
import torch
from random_models import make_random_model
from safetensors.torch import load_file

import resid
from resid.analyses import Execution, logit_lens
from resid.analyses.lenses import JacobianLens, LogitLens, fit_jacobian, formats, interventions
from resid.analyses.lenses.jacobian import JacobianJob, window_sums
from resid.interventions import Hook
from resid.sites import Site

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "jlens"
SKIP = 2  # the fixture's skip_first_positions
QUIET = Execution(progress=False)


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    return resid.load(FIXTURE / "model")


@pytest.fixture(scope="module")
def reference() -> dict:
    return load_file(str(FIXTURE / "reference.safetensors"))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def test_fit_equals_transformerlens(model, reference):
    layers = range(model.config.n_layers - 1)
    lens = fit_jacobian(model, reference["ids"], sites=[Site(layer, "resid_post") for layer in layers],
                        skip_first=SKIP, execution=Execution(batch_size=2, progress=False))
    for i, layer in enumerate(layers):
        assert relative(lens.jacobians[i].cpu(), reference[f"fit.J.{layer}"]) < 1e-4, layer
    assert lens.info["windows"] == len(reference["ids"])


def test_fit_on_smollm2s_first_layers_equals_transformerlens(smollm2):
    reference = load_file(str(FIXTURE / "smollm2.safetensors"))  # make_jlens_reference.py: SMOLLM2_*
    small = resid.first_layers(smollm2, 3)
    sites = [Site(layer, "resid_post") for layer in range(2)]
    lens = fit_jacobian(small, reference["ids"], sites=sites, skip_first=4, block=32,
                        execution=Execution(batch_size=len(reference["ids"]), progress=False))
    for i in range(2):
        assert relative(lens.jacobians[i].cpu(), reference[f"fit.J.{i}"]) < 1e-4, i
    with torch.no_grad():
        run = small.run(reference["readout.ids"][None])
        for i, site in enumerate(sites):
            logits = lens.logits(run.stream.resid_post(i)[0, -1], site).float()
            top = reference["readout.top_ids"][i]
            torch.testing.assert_close(logits[top], reference["readout.top_logits"][i], atol=1e-4, rtol=1e-4)
            assert int(logits.argmax()) == int(top[0])


@torch.no_grad()
def test_the_reference_file_gives_the_reference_readout(model, reference):
    lens = formats.read(model, FIXTURE / "jlens.pt")
    assert isinstance(lens, JacobianLens) and lens.sites == tuple(Site(l, "resid_post") for l in range(3))
    assert lens.info["windows"] == 5 and lens.info["transformer_lens_version"] == "4.3.0"
    ids = reference["readout.ids"][None]
    run = model.run(ids)
    for layer in range(model.config.n_layers):
        site = Site(layer, "resid_post")
        logits = lens.logits(run.stream.resid_post(layer)[0], site).float()
        torch.testing.assert_close(logits, reference[f"readout.{layer}"], atol=1e-5, rtol=1e-5)


def test_identity_is_the_logit_lens_exactly(model):
    text = ["the big dog saw a small cat under the old tree", "a cat sat"]
    for frozen in (False, True):
        plain = logit_lens.run(model, text, positions="all", every="layer", k=3,
                               lens=LogitLens(model, frozen_norm=frozen))
        jlens = logit_lens.run(model, text, positions="all", every="layer", k=3,
                               lens=JacobianLens.identity(model).with_frozen_norm(frozen))
        assert set(jlens["lens"]) == {"jacobian"}
        columns = [c for c in plain.columns if c != "lens"]
        assert plain[columns].equals(jlens[columns])  # h @ I^T == h: not close, equal


def brute_force(model: resid.Transformer, ids: torch.Tensor, site: Site, skip_first: int) -> torch.Tensor:
    """The estimator of the module docstring, term by term: the full Jacobian of each window by autograd."""
    n_layers, d = model.config.n_layers, model.config.d_model
    total = torch.zeros(d, d, dtype=torch.float64)
    for window in ids:
        def final(delta, window=window):
            hooks = [Hook(site, lambda resid, tokens: resid + delta)]
            return model.run(window[None], interventions=hooks, grad=True).stream.resid_post(n_layers - 1)[0]

        full = torch.autograd.functional.jacobian(final, torch.zeros(1, len(window), d), vectorize=True)[:, :, 0]
        valid = range(skip_first, len(window) - 1)
        summed = sum(full[later, :, t].double() for t in valid for later in valid if later >= t)
        total += summed / len(valid)
    return total / len(ids)


@pytest.mark.parametrize("kind", ["gemma3_like", "neox_parallel"])  # post-norms and soft caps; parallel
def test_fit_is_the_expected_jacobian_whatever_the_batch_and_block(kind):
    model = make_random_model(kind)  # [t' i t j] above: the full Jacobian of a window
    ids = torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    sites = [Site(0, "resid_pre"), Site(1, "resid_post")]
    one = fit_jacobian(model, ids, sites=sites, skip_first=2, execution=Execution(batch_size=1, progress=False))
    blocked = fit_jacobian(model, ids, sites=sites, skip_first=2, block=12,
                           execution=Execution(batch_size=2, progress=False))
    for i, site in enumerate(sites):
        expected = brute_force(model, ids, site, 2)
        assert relative(one.jacobians[i].cpu(), expected) < 1e-5, site.label
        assert relative(blocked.jacobians[i].cpu(), expected) < 1e-5, site.label


def test_a_restored_fit_goes_on_to_the_same_lens(tmp_path):
    model = make_random_model("llama_gqa")
    ids = torch.randint(0, model.config.d_vocab, (4, 8), generator=torch.Generator().manual_seed(2))
    whole = fit_jacobian(model, ids, skip_first=1, block=16, execution=Execution(batch_size=1, progress=False))
    args = (model, ids, None, "layer", 8, None, 1, 16, 1)
    first = JacobianJob(*args)
    for chunk in list(first.chunks())[:2]:
        list(first.consume(window_sums(model, chunk, first.sites, 1, 16)))
    tensors, metadata = first.state()
    second = JacobianJob(*args)
    second.restore(tensors, metadata)
    assert second.step == 2 and second.windows_done == 2
    for chunk in second.chunks():
        list(second.consume(window_sums(model, chunk, second.sites, 1, 16)))
    assert relative(second.finish(None).jacobians, whole.jacobians) < 1e-6
    # through the driver: a finished checkpoint is resumed, not recomputed, and gives the same lens
    out = tmp_path / "fit"
    quiet = Execution(batch_size=4, progress=False, out=out)
    saved = fit_jacobian(model, ids, skip_first=1, block=16, execution=quiet)
    again = fit_jacobian(model, ids, skip_first=1, block=16, execution=quiet)
    assert (out / "checkpoint.safetensors").is_file() and again.jacobians.equal(saved.jacobians)


@torch.no_grad()
def test_frozen_jlens_is_a_sum_of_writes_through_j_transposed(random_model):
    ids = torch.randint(0, random_model.config.d_vocab, (1, 8), generator=torch.Generator().manual_seed(3))
    lens = fit_jacobian(random_model, ids, skip_first=1, block=random_model.config.d_model,
                        execution=QUIET).with_frozen_norm(True)
    text = "Residual streams are sums of writes into"
    df = logit_lens.run(random_model, text, targets=" the", every="layer", lens=lens)
    run = random_model.run(text, capture=resid.Capture.all())
    direction = random_model.readout.logit_direction([int(df["target_id"].iloc[0])], run.stream.final_norm_scale[:, -1])
    sites, writes = run.stream.components()
    cap = random_model.config.final_softcap
    for layer in range(random_model.config.n_layers - 1):
        pulled, carried = lens.direction(direction, Site(layer, "resid_post"))
        before = [i for i, site in enumerate(sites) if site.layer is None or site.layer <= layer]
        value = float(sum(pulled.project(writes[i][:, -1]) for i in before) + pulled.bias + carried)
        expected = value if cap is None else cap * torch.tanh(torch.tensor(value / cap)).item()
        got = df[(df.site == f"layers[{layer}].resid_post") & (df["rank"] == 1)]["target_logit"].item()
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)


@torch.no_grad()
def test_interventions_act_in_lens_coordinates(model, reference):
    lens = formats.read(model, FIXTURE / "jlens.pt")
    site, ids = Site(1, "resid_post"), reference["readout.ids"][None]
    tokens = ["cat", "dog"]
    clean = model.run(ids).stream.resid_post(1)
    coords = interventions.coordinates(lens, site, tokens, clean)

    ablated = model.run(ids, interventions=[interventions.ablate(lens, site, tokens)]).stream.resid_post(1)
    assert interventions.coordinates(lens, site, tokens, ablated).abs().max() < 1e-4
    swapped = model.run(ids, interventions=[interventions.swap(lens, site, *tokens)]).stream.resid_post(1)
    torch.testing.assert_close(interventions.coordinates(lens, site, tokens, swapped), coords.flip(-1),
                               atol=1e-4, rtol=1e-4)
    values = torch.tensor([2.0, -1.0])
    patched = model.run(ids, interventions=[interventions.patch(lens, site, tokens, values)]).stream.resid_post(1)
    torch.testing.assert_close(interventions.coordinates(lens, site, tokens, patched),
                               values.expand_as(coords), atol=1e-4, rtol=1e-4)
    unit = interventions.lens_vectors(lens, site, "cat")[0]
    steered = model.run(ids, interventions=[interventions.steer(lens, site, "cat", alpha=0.5)]).stream.resid_post(1)
    shift = 0.5 * clean.norm(dim=-1).median() * unit / unit.norm()
    torch.testing.assert_close(steered - clean, shift.expand_as(clean), atol=1e-4, rtol=1e-4)
    with pytest.raises(resid.ResidError, match="no Jacobian for layers\\[0\\].resid_pre"):
        interventions.steer(lens, Site(0, "resid_pre"), "cat")


def test_both_layouts_round_trip(model, reference, tmp_path):
    lens = fit_jacobian(model, reference["ids"], skip_first=SKIP, block=16, execution=QUIET)
    assert lens.sites[0] == Site(0, "resid_pre")  # resid fits the embeddings too
    read = formats.read(model, formats.write(lens, tmp_path / "resid"))
    assert read.sites == lens.sites and read.jacobians.equal(lens.jacobians) and read.info == lens.info
    with pytest.raises(resid.ResidError, match="block outputs"):
        formats.write(lens, tmp_path / "tl", layout="transformer-lens")
    blocks = JacobianLens(model, lens.sites[1:], lens.jacobians[1:], lens.info)
    folder = formats.write(blocks, tmp_path / "tl", layout="transformer-lens")
    payload = torch.load(folder / formats.JLENS_PT, weights_only=True)
    assert set(payload) >= {"J", "n_prompts", "source_layers", "d_model"} and payload["source_layers"] == [0, 1, 2]
    read = formats.read(model, folder / formats.JLENS_PT)
    assert read.sites == blocks.sites and read.jacobians.equal(blocks.jacobians)


def test_bad_lenses_are_one_clear_error(model, tmp_path):
    with pytest.raises(resid.ResidError, match="fitted for another model"):
        JacobianLens(model, [Site(0, "resid_post")], torch.zeros(1, 8, 8))
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(resid.ResidError, match="is not a J-lens"):
        formats.read(model, tmp_path / "other.pt")
    lens = JacobianLens(model, [Site(0, "resid_post")], torch.eye(16)[None])
    with pytest.raises(resid.ResidError, match="no Jacobian for layers\\[0\\].resid_pre"):
        logit_lens.run(model, "a cat sat", every="layer", lens=lens)
    with pytest.raises(resid.ResidError, match="no position left"):
        fit_jacobian(model, torch.ones(2, 4, dtype=torch.long), skip_first=3, execution=QUIET)
