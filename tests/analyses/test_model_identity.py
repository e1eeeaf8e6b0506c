"""One model identity (resid.identity: the weights as they are, dtype, config) behind provenance, result stores
and workers: a store written by other weights is refused, never silently resumed, whether the model was edited in
place or its file was replaced under the same name."""

import pytest
import torch
from host_syncs import HostSyncs
from random_models import make_random_model
from swap_prompts import BASELINES, PROMPTS, TARGETS
from tiny_models import build

import resid
from resid.analyses import Execution, ablation, attribution
from resid.errors import ResidError


def _sweep(model, out):
    return ablation.sweep(model, PROMPTS[:2], TARGETS[:2], BASELINES[:2], sites="layer", execution=Execution(out=out))


def test_the_identity_follows_the_weights_not_the_name(random_model):
    before = resid.identity(random_model)
    assert before == resid.identity(random_model)  # the same weights hash the same
    random_model.blocks[0].mlp.W_out.data.mul_(2)  # an edit the parameters' version counters do not see
    after = resid.identity(random_model)
    assert after.weights != before.weights and after.config == before.config and after.name == before.name
    random_model.blocks[0].mlp.W_out.data.div_(2)
    assert resid.identity(random_model) == before


def test_a_store_of_an_edited_model_is_refused(gpt2_tokenizer, tmp_path):
    """The probe's case: W_out.data.mul_(2) between two sweeps with the same out= used to return the first model's
    numbers."""
    from random_models import make_random_model

    model = make_random_model("gpt2_like", gpt2_tokenizer)
    out = tmp_path / "sweep.csv"
    first = _sweep(model, out)
    again = _sweep(model, out)  # the same model resumes (nothing left to compute) and gives the same table
    assert again["ablated_metric"].tolist() == first["ablated_metric"].tolist()
    model.blocks[0].mlp.W_out.data.mul_(2)
    with pytest.raises(ResidError, match=r"holds results of a different sweep.*'model'"):
        _sweep(model, out)


def test_a_replaced_weight_file_of_the_same_name_is_refused(tmp_path):
    folder = tmp_path / "model"
    build("llama", folder)
    out = tmp_path / "sweep.parquet"
    _sweep(resid.load(folder), out)
    other = tmp_path / "other"
    _perturbed(folder, other)
    (folder / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(ResidError, match="holds results of a different sweep"):
        _sweep(resid.load(folder), out)


def _perturbed(folder, other):
    """The same model with one weight changed, saved in `other`."""
    from safetensors.torch import load_file, save_file

    other.mkdir()
    weights = load_file(folder / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, other / "model.safetensors")


def test_provenance_records_the_identity(random_model):
    df = attribution.direct(random_model, PROMPTS[0], " Mary")
    recorded = df.attrs["provenance"]["identity"]
    assert recorded == resid.identity(random_model).as_dict()
    with torch.no_grad():
        random_model.blocks[0].mlp.W_out.mul_(1.5)
    assert attribution.direct(random_model, PROMPTS[0], " Mary").attrs["provenance"]["identity"] != recorded


def test_resid_identity_stays_the_function_after_its_module_is_imported():
    import resid.identities  # noqa: F401  -- importing a submodule must not rebind resid.identity

    assert callable(resid.identity) and resid.identity is resid.identities.identity


def test_provenance_reuses_the_identity_until_the_weights_change(random_model, monkeypatch):
    """Provenance (every analysis call) hashes the weights again only when an edit is seen: a version counter
    (torch in-place ops), a replaced parameter or a sampled element (`.data` edits)."""
    from resid import identities

    hashed = []
    real = identities._hash
    monkeypatch.setattr(identities, "_hash", lambda model: hashed.append(1) or real(model))
    first = identities.identity(random_model, reuse=True)
    assert identities.identity(random_model, reuse=True) == first and len(hashed) == 1
    assert identities.identity(random_model) == first and len(hashed) == 2  # stores and workers always hash
    W = random_model.blocks[0].mlp.W_out
    W.data.mul_(2)  # invisible to the version counter: the sampled elements see it
    scaled = identities.identity(random_model, reuse=True)
    assert scaled.weights != first.weights and scaled == resid.identity(random_model)
    with torch.no_grad():
        W[0, 1] += 1.0  # one element, perhaps no sampled one: the version counter sees it
    assert identities.identity(random_model, reuse=True) == resid.identity(random_model) != scaled
    path, parameter = next(iter(random_model.named_parameters()))
    owner, _, attribute = path.rpartition(".")
    setattr(random_model.get_submodule(owner), attribute, torch.nn.Parameter(parameter.detach().clone()))  # new tensor
    calls = len(hashed)
    assert identities.identity(random_model, reuse=True) == resid.identity(random_model)
    assert len(hashed) == calls + 2


def test_the_sampled_elements_stay_inside_large_parameters(random_model):
    """A parameter of SmolLM2's embedding size (49,152 x 576): float32 positions from linspace rounded past its end."""
    from resid import identities

    path, _ = next(iter(random_model.named_parameters()))
    owner, _, attribute = path.rpartition(".")
    setattr(random_model.get_submodule(owner), attribute, torch.nn.Parameter(torch.zeros(49_152, 576)))
    _, sample = identities._state(random_model)
    assert len(sample) == sum(min(identities.SAMPLE, p.numel()) for p in random_model.parameters())


def test_a_reused_identity_reads_the_device_once_whatever_the_depth() -> None:
    """identity(reuse=True) after the first call checks each parameter's sample, moved to the host in one piece per
    device: not one synchronisation per parameter, which made every provenance record wait on a GPU ~280 times."""
    counts = []
    for n_layers in (2, 6):
        model = make_random_model("llama_gqa", n_layers=n_layers)
        resid.identity(model, reuse=True)
        with HostSyncs() as syncs:
            resid.identity(model, reuse=True)
        counts.append(syncs.count)
    assert counts == [1, 1], counts
