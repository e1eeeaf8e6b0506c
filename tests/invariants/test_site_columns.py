"""One address to the top floor: every table's `site` column holds Site labels that parse back to the same Site
(Site.parse(label).label == label), whichever analysis wrote it: attribution (to heads, neurons and dictionary
features), the logit lens, ablation sweeps, activation and attribution patching, a dictionary's feature scan, the
dictionaries' own decomposition, and an attribution graph's nodes."""

import pandas as pd
import torch
from random_dictionaries import random_dictionary
from random_models import make_random_model
from random_transcoders import per_layer

from resid import Site
from resid.analyses import ablation, attribution, features, graphs, logit_lens, patching
from resid.analyses.features.by_dictionary import by_dictionary

IDS = torch.tensor([[11, 5, 7, 2, 9, 31], [4, 8, 15, 16, 23, 42]])
CORPUS = ["The quick brown fox jumps over the lazy dog, again and again.", "Hello there, general Kenobi."]
CLEAN, CORRUPT = ["The cat sat on the", "A dog lay on the"], ["The dog sat on the", "A cat lay on the"]


def _labels_parse_back(name: str, frame: pd.DataFrame) -> None:
    labels = frame["site"].dropna().unique().tolist()
    assert labels, f"{name}: no site labels"
    for label in labels:
        assert Site.parse(label).label == label, f"{name}: {label!r} does not parse back"


def test_every_tables_site_column_parses_back(gpt2_tokenizer) -> None:
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1, name="r1")
    twin = random_dictionary(model, "blocks.1.hook_resid_post", seed=2, name="r1b")  # two at one site
    transcoder = random_dictionary(model, "blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out", seed=3)
    texts = [[int(i) for i in row] for row in IDS]
    frames = {
        "attribution (head)": attribution.direct(model, IDS, targets=3, level="head"),
        "attribution (neuron)": attribution.direct(model, IDS, targets=3, level="neuron"),
        "attribution (features)": attribution.direct(model, IDS, targets=3, dictionaries=[sae, transcoder]),
        "logit lens": logit_lens.run(model, IDS, targets=3),
        "ablation": ablation.sweep(model, IDS, targets=3, sites="head"),
        "patching": patching.activation(model, CLEAN, CORRUPT, targets=" mat", sites="head"),
        "patching (features)": patching.activation(model, CLEAN, CORRUPT, targets=" mat", sites="feature",
                                                   dictionaries=[sae]),
        "atp": patching.atp(model, CLEAN, CORRUPT, targets=" mat", sites=["resid_pre", "sublayer", "head"]),
        "by dictionary": by_dictionary(model, IDS, [sae, twin, transcoder]),
        "feature scan": features.top_activating(model, [sae, twin], CORPUS, k=2, window=16),
        "graph": graphs.attribute(model, texts[0], per_layer(model)).to_frame(),
    }
    for name, frame in frames.items():
        _labels_parse_back(name, frame)
    scan = frames["feature scan"]  # two dictionaries at one site: each feature's label names its dictionary
    assert {Site.parse(label).dictionary for label in scan["site"]} == set(scan["dictionary"]) == {"r1", "r1b"}
