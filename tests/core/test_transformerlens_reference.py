"""resid's TransformerLens names against TransformerLens itself: on a tiny random GPT-2 and Llama that both load
(tests/data/transformerlens-hooks, made by tests/data/make_transformerlens_hooks_reference.py in TransformerLens's own
environment), every name resid's view offers is one of TransformerLens's hook points and reads TransformerLens's
activation; every name TransformerLens fires that resid does not offer is one resid's table knows and explains (a
row it does not record, or one this model has not), so that none is silently missing. Rows may be added to the table
(a name moves from "explained" to "compared"); none may map a name to the wrong tensor."""

import json
from pathlib import Path

import pytest
import torch
from numerics import TINY
from safetensors.torch import load_file

import resid
from resid import hook_names
from resid.sites import transformerlens

DATA = Path(__file__).resolve().parents[1] / "data"  # tests/data

FIXTURE = DATA / "transformerlens-hooks"
# TransformerLens names outside resid's table: unembed.hook_out is the logits (run.logits, compared in the first test);
# unembed.hook_in is the final norm's output after its gain, which resid computes inside its lenses but does not name
OUTSIDE_THE_TABLE = {"unembed.hook_in", "unembed.hook_out"}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def family(request):
    name = request.param
    model = resid.load(FIXTURE / name / "model")
    theirs = load_file(str(FIXTURE / f"{name}.safetensors"))
    names = json.loads((FIXTURE / f"{name}.json").read_text())
    run = model.run(theirs["input_ids"], capture=resid.Capture.all())
    return model, run, theirs, names


def test_the_model_is_transformerlens_model(family):
    _, run, theirs, _ = family
    torch.testing.assert_close(run.logits, theirs["logits"], **TINY)


def test_every_name_resid_offers_is_transformerlens_and_reads_its_tensor(family):
    model, run, theirs, names = family
    view = hook_names.view(run, model)
    offered = list(view)
    assert set(offered) <= set(names["hook_points"]), "names TransformerLens does not have"
    compared = [name for name in offered if name in theirs]
    assert {"hook_embed", "blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post"} <= \
        set(compared)
    for name in compared:
        torch.testing.assert_close(view[name], theirs[name], **TINY, msg=lambda m, name=name: f"{name}: {m}")


def test_every_name_resid_does_not_offer_is_explained(family):
    model, run, _, names = family
    view = hook_names.view(run, model)
    known = transformerlens.facts(model.config)
    unexplained = []
    for name in names["cached"]:
        if name in view or name in OUTSIDE_THE_TABLE:
            continue
        _, rows = transformerlens.rows(name)
        if not any(row.role == "unrecorded" or not transformerlens.has(row, known) for row in rows):
            unexplained.append(name)
        with pytest.raises(resid.ResidError):  # asking for it says why (the view's own error)
            view[name]
    assert not unexplained, f"TransformerLens names resid neither offers nor explains: {unexplained}"
