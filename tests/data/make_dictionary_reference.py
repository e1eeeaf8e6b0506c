"""Regenerate tests/data/dictionaries/: tiny dictionaries in every format resid reads, and each reference
library's own encode / decode of fixed inputs, the oracle of tests/dictionaries/test_reference.py.

    python tests/data/make_dictionary_reference.py            # build the venv if needed, rewrite the fixtures
    python tests/data/make_dictionary_reference.py --check    # regenerate elsewhere, compare, write nothing
    .venv/bin/python tests/data/make_dictionary_reference.py --saelens-reads   # SAELens reads what resid writes

--saelens-reads (run with a Python that has resid) is the one mode that imports resid: it writes every fixture
SAELens can express with resid.dictionaries.formats.saelens.write, with resid's own outputs beside them, and has
SAELens (SAE.load_from_disk, in the reference venv) load each and compare its outputs with resid's.

The script makes its own virtual environment (build/dictionary-reference-venv: torch==2.13.0 first, so that pip
does not pull a CUDA build, then the pinned libraries below from PyPI) and re-runs itself inside it. resid is
deliberately not imported, so the references cannot agree with resid by construction.

Each fixture is a folder written by the library itself where it writes that format (SAELens: SAE.save_model /
save_inference_model; sparsify: SparseCoder.save_to_disk; circuit-tracer: to_safetensors), or, for the Gemma Scope
files no library writes, in the layout Google publishes (params.safetensors / params.npz + config.json), with the
reference computed by the library that reads that layout, built exactly as its loader builds it (noted per fixture
in manifest.json). Beside each folder, <name>.reference.safetensors holds the inputs x, the library's feature
activations `acts` and its reconstruction `out` (a skip path included). Widths: d_in = 48 (the tiny test models'
d_model, or 4 heads x 12 for the z-SAE), 16 features, 2 layers.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "dictionaries"
VENV = ROOT / "build" / "dictionary-reference-venv"
PINS = ["sae-lens==6.54.12", "eai-sparsify==1.3.3", "circuit-tracer==0.5.0"]
D_IN, D_SAE, N_X, MODEL = 48, 16, 6, "tiny-random-llama"
TOLERANCE = 1e-6  # --check: largest |difference| between a regenerated reference and the committed one


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: the CPU wheel, before the libraries ask
        subprocess.run([*pip, *PINS], check=True)
    return python


# ------------------------------------------------------------------------------------------------------ inside
def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"libraries": {p.split("==")[0]: md.version(p.split("==")[0]) for p in PINS},
                "torch": torch.__version__, "fixtures": {}}
    for module in (saelens_fixtures, gemma_scope_fixtures, sparsify_fixtures, circuit_tracer_fixtures):
        manifest["fixtures"].update(module(out))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    licences = out / "LICENSES"
    licences.mkdir(exist_ok=True)
    for dist in ("sae-lens", "eai-sparsify", "circuit-tracer"):
        files = [f for f in md.distribution(dist).files if f.name.startswith("LICENSE")]
        shutil.copy(md.distribution(dist).locate_file(files[0]), licences / f"{dist}.LICENSE")


def randomize(module, generator, threshold_scale: float = 0.3) -> None:
    """Every parameter N(0, 0.3) (thresholds: N(0, threshold_scale), so some are negative)."""
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            scale = threshold_scale if "threshold" in name else 0.3
            param.copy_(scale * torch.randn(param.shape, generator=generator))


def save_reference(out: Path, name: str, x, acts, recon, extra: dict | None = None) -> str:
    from safetensors.torch import save_file

    path = out / f"{name}.reference.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"x": x, "acts": acts, "out": recon, **(extra or {})}
    save_file({k: v.detach().float().contiguous() for k, v in tensors.items()}, str(path))
    return path.relative_to(out).as_posix()


def saelens_fixtures(out: Path) -> dict:
    import torch
    from sae_lens import SAE
    from sae_lens.saes import (
        BatchTopKTrainingSAE,
        BatchTopKTrainingSAEConfig,
        GatedSAE,
        GatedSAEConfig,
        JumpReLUSAE,
        JumpReLUSAEConfig,
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        SkipTranscoder,
        SkipTranscoderConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
        Transcoder,
        TranscoderConfig,
    )
    from sae_lens.saes.sae import SAEMetadata

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_X, D_IN, generator=generator)
    meta = lambda hook, out=None: SAEMetadata(model_name=MODEL, hook_name=hook, hook_head_index=None,  # noqa: E731
                                              **({"hook_name_out": out} if out else {}))
    sae_kw = lambda hook, **kw: dict(d_in=D_IN, d_sae=D_SAE, metadata=meta(hook), **kw)  # noqa: E731
    tc_kw = lambda hook, hook_out: dict(d_in=D_IN, d_sae=D_SAE, d_out=D_IN, apply_b_dec_to_input=False,  # noqa: E731
                                        metadata=meta(hook, hook_out))
    fixtures = {
        "standard": (StandardSAE, StandardSAEConfig(**sae_kw("blocks.1.hook_resid_post"))),
        "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig(**sae_kw("blocks.0.hook_mlp_out", apply_b_dec_to_input=False))),
        "topk": (TopKSAE, TopKSAEConfig(**sae_kw("blocks.1.hook_resid_pre", k=4))),
        "gated": (GatedSAE, GatedSAEConfig(**sae_kw("blocks.0.hook_attn_out"))),
        "layer_norm": (StandardSAE, StandardSAEConfig(**sae_kw("blocks.1.hook_resid_mid",
                                                               normalize_activations="layer_norm"))),
        "constant_norm_rescale": (StandardSAE, StandardSAEConfig(**sae_kw(
            "blocks.0.hook_resid_post", normalize_activations="constant_norm_rescale"))),
        "expected_average": (StandardSAE, StandardSAEConfig(**sae_kw(
            "blocks.0.hook_resid_pre", normalize_activations="expected_average_only_in"))),
        "hook_z": (StandardSAE, StandardSAEConfig(**sae_kw("blocks.1.attn.hook_z", reshape_activations="hook_z"))),
        "transcoder": (Transcoder, TranscoderConfig(**tc_kw("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"))),
        "skip_transcoder": (SkipTranscoder, SkipTranscoderConfig(**tc_kw("blocks.1.hook_mlp_in",
                                                                         "blocks.1.hook_mlp_out"))),
        "jumprelu_transcoder": (JumpReLUTranscoder, JumpReLUTranscoderConfig(**tc_kw("blocks.1.mlp.hook_in",
                                                                                     "blocks.1.mlp.hook_out"))),
        "jumprelu_skip_transcoder": (JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig(**tc_kw(
            "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"))),
    }
    manifest = {}
    for name, (cls, cfg) in fixtures.items():
        folder = out / "saelens" / name
        sae = cls(cfg)
        randomize(sae, generator)
        sae.save_model(folder)
        extra, note = {}, "written by SAELens (SAE.save_model); reference: SAE.load_from_disk, then forward"
        loaded = SAE.load_from_disk(folder)
        if name == "expected_average":  # the factor SAELens's registry would give; from_pretrained folds it
            loaded.fold_activation_norm_scaling_factor(2.5)
            extra["norm_scaling_factor"] = torch.tensor([2.5])
            note += " after fold_activation_norm_scaling_factor(2.5)"
        manifest[f"saelens/{name}"] = _saelens_reference(out, f"saelens/{name}", loaded, x, extra, note)
    # BatchTopK: trained as TopK over the batch, saved for inference as JumpReLU with one shared threshold
    folder = out / "saelens" / "batchtopk"
    training = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(**sae_kw("blocks.1.hook_resid_post", k=4)))
    randomize(training, generator)
    training.topk_threshold = torch.tensor(0.4)
    training.save_inference_model(folder)
    manifest["saelens/batchtopk"] = _saelens_reference(
        out, "saelens/batchtopk", SAE.load_from_disk(folder), x, {},
        "written by SAELens (BatchTopKTrainingSAE.save_inference_model: jumprelu); reference: SAE.load_from_disk")
    # A file from before SAELens 6: flat fields (hook_name, activation_fn_str), no metadata; SAELens converts it
    folder = out / "saelens" / "legacy"
    sae = StandardSAE(StandardSAEConfig(**sae_kw("blocks.0.hook_resid_pre")))
    randomize(sae, generator)
    sae.save_model(folder)
    legacy = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "model_name": MODEL,
              "hook_name": "blocks.0.hook_resid_pre", "hook_layer": 0, "hook_head_index": None,
              "activation_fn_str": "relu", "apply_b_dec_to_input": True, "finetuning_scaling_factor": False,
              "context_size": 128, "dataset_path": "tiny", "prepend_bos": True, "normalize_activations": "none",
              "sae_lens_training_version": "3.0.0"}
    (folder / "cfg.json").write_text(json.dumps(legacy))
    manifest["saelens/legacy"] = _saelens_reference(
        out, "saelens/legacy", SAE.load_from_disk(folder), x, {},
        "weights by SAELens, cfg.json in SAELens 3-5's flat layout by hand; reference: SAE.load_from_disk")
    return manifest


def _saelens_reference(out: Path, name: str, sae, x, extra: dict, note: str) -> dict:
    import torch

    with torch.no_grad():
        heads = sae.cfg.reshape_activations == "hook_z"
        inputs = x.reshape(N_X, 4, D_IN // 4) if heads else x  # hook_z SAEs read [... head d_head]
        acts = sae.encode(inputs)
        # skip transcoders add x @ W_skip.T in forward only; decode undoes the run-time normalization of the
        # encode just before it (layer_norm, constant_norm_rescale)
        recon = sae.forward(inputs) if hasattr(sae, "W_skip") else sae.decode(acts)
    reference = save_reference(out, name, x, acts, recon.reshape(N_X, -1), extra)
    return {"format": "saelens", "folder": name, "reference": reference, "note": note}


def gemma_scope_fixtures(out: Path) -> dict:
    """No library writes Gemma Scope files: they are written here in Google's layout, and the reference is SAELens's
    JumpReLU SAE / skip transcoder holding the tensors exactly as SAELens's Gemma Scope loaders map them
    (pretrained_sae_loaders: gemma_3_sae_huggingface_loader, gemma_2_sae_huggingface_loader)."""
    import numpy as np
    import torch
    from sae_lens.saes import JumpReLUSAE, JumpReLUSAEConfig, JumpReLUSkipTranscoder, JumpReLUSkipTranscoderConfig
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(2)
    x = torch.randn(N_X, D_IN, generator=generator)
    rand = lambda *shape: 0.3 * torch.randn(*shape, generator=generator)  # noqa: E731
    manifest = {}
    kinds = {"sae": ("model.layers.1.output", "model.layers.1.output", False),
             "transcoder": ("model.layers.0.pre_feedforward_layernorm.output",
                            "model.layers.0.post_feedforward_layernorm.output", True)}
    for kind, (hook_in, hook_out, affine) in kinds.items():
        params = {"w_enc": rand(D_IN, D_SAE), "w_dec": rand(D_SAE, D_IN), "b_enc": rand(D_SAE), "b_dec": rand(D_IN),
                  "threshold": rand(D_SAE)}
        if affine:
            params["affine_skip_connection"] = rand(D_IN, D_IN)
        folder = out / "gemma_scope_2" / kind
        folder.mkdir(parents=True, exist_ok=True)
        save_file(params, str(folder / "params.safetensors"))
        config = {"width": D_SAE, "model_name": "google/tiny-random-gemma-3", "architecture": "jump_relu", "l0": 4,
                  "affine_connection": affine, "hf_hook_point_in": hook_in, "hf_hook_point_out": hook_out,
                  "type": kind}
        (folder / "config.json").write_text(json.dumps(config))
        state = {"W_enc": params["w_enc"], "W_dec": params["w_dec"], "b_enc": params["b_enc"],
                 "b_dec": params["b_dec"], "threshold": params["threshold"]}
        if affine:
            state["W_skip"] = params["affine_skip_connection"].T.contiguous()
            sae = JumpReLUSkipTranscoder(JumpReLUSkipTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_IN,
                                                                      apply_b_dec_to_input=False))
        else:
            sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=False))
        sae.load_state_dict(state)
        with torch.no_grad():
            acts = sae.encode(x)
            recon = sae.forward(x) if affine else sae.decode(acts)
        name = f"gemma_scope_2/{kind}"
        manifest[name] = {"format": "gemma_scope", "folder": name, "reference": save_reference(out, name, x, acts,
                                                                                                recon),
                          "note": "written here in Gemma Scope 2's layout; reference: SAELens JumpReLU classes "
                                  "holding the tensors as gemma_3_sae_huggingface_loader maps them"}
    folder = out / "gemma_scope_1" / "sae"
    folder.mkdir(parents=True, exist_ok=True)
    params = {"W_enc": rand(D_IN, D_SAE), "W_dec": rand(D_SAE, D_IN), "b_enc": rand(D_SAE), "b_dec": rand(D_IN),
              "threshold": rand(D_SAE)}
    np.savez(folder / "params.npz", **{k: v.numpy() for k, v in params.items()})
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=False))
    with np.load(folder / "params.npz") as data:  # as gemma_2_sae_huggingface_loader: W_* keys kept
        sae.load_state_dict({k: torch.tensor(data[k]) for k in data})
    with torch.no_grad():
        acts = sae.encode(x)
        recon = sae.decode(acts)
    manifest["gemma_scope_1/sae"] = {
        "format": "gemma_scope", "folder": "gemma_scope_1/sae", "hook": "blocks.1.hook_resid_post",
        "reference": save_reference(out, "gemma_scope_1/sae", x, acts, recon),
        "note": "written here in Gemma Scope 1's params.npz layout; reference: SAELens JumpReLUSAE loaded as "
                "gemma_2_sae_huggingface_loader loads it"}
    return manifest


def sparsify_fixtures(out: Path) -> dict:
    """A sparsify run: one folder per hookpoint, written by SparseCoder.save_to_disk."""
    import torch
    from sparsify import SparseCoder, SparseCoderConfig

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(N_X, D_IN, generator=generator)
    manifest = {}
    for hookpoint, transcode, skip in (("layers.1", False, False), ("layers.0.mlp", True, True)):
        coder = SparseCoder(D_IN, SparseCoderConfig(k=4, num_latents=D_SAE, transcode=transcode,
                                                    skip_connection=skip))
        randomize(coder, generator)
        folder = out / "sparsify" / hookpoint
        coder.save_to_disk(folder)
        loaded = SparseCoder.load_from_disk(folder)
        with torch.no_grad():
            result = loaded(x)
        acts = torch.zeros(N_X, D_SAE).scatter_(-1, result.latent_indices, result.latent_acts)
        name = f"sparsify/{hookpoint}"
        manifest[name] = {"format": "sparsify", "folder": name, "reference": save_reference(out, name, x, acts,
                                                                                             result.sae_out),
                          "note": "written by sparsify (SparseCoder.save_to_disk); reference: load_from_disk, "
                                  "forward (top-k latents scattered into a dense [N feature])"}
    return manifest


def circuit_tracer_fixtures(out: Path) -> dict:
    """A per-layer transcoder set (JumpReLU with negative thresholds, skip connections) and a cross-layer
    transcoder, in circuit-tracer's cached layout (config.yaml + layer files), written by its to_safetensors."""
    import torch
    import yaml
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, load_transcoder_set

    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, N_X, D_IN, generator=generator)  # one input per layer
    manifest = {}
    folder = out / "circuit_tracer" / "plt"
    folder.mkdir(parents=True, exist_ok=True)
    for layer in range(2):
        transcoder = SingleLayerTranscoder(D_IN, D_SAE, JumpReLU(torch.zeros(D_SAE), 0.1), layer,
                                           skip_connection=True, device=cpu, dtype=torch.float32)
        randomize(transcoder, generator)
        transcoder.to_safetensors(str(folder / f"layer_{layer}.safetensors"))
    config = {"model_name": MODEL, "model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
              "feature_output_hook": "mlp.hook_out", "scan": "tiny-plt"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    paths = {layer: str(folder / f"layer_{layer}.safetensors") for layer in range(2)}
    loaded = load_transcoder_set(paths, "tiny-plt", "mlp.hook_in", "mlp.hook_out", device=cpu, dtype=torch.float32,
                                 lazy_encoder=False, lazy_decoder=False)
    with torch.no_grad():
        acts = loaded.encode(x)
        recon = loaded.decode(acts, x)
    manifest["circuit_tracer/plt"] = {
        "format": "circuit_tracer", "folder": "circuit_tracer/plt",
        "reference": save_reference(out, "circuit_tracer/plt", x, acts, recon),
        "note": "written by circuit-tracer (SingleLayerTranscoder.to_safetensors); reference: load_transcoder_set, "
                "encode, decode(acts, x); x, acts and out are [layer N ...]"}
    # Gemma Scope files listed in config.yaml: layer 0 in Gemma Scope 1's params.npz layout, layer 1 in Gemma
    # Scope 2's (with an affine skip), read by circuit-tracer's own loaders for them
    import numpy as np
    from circuit_tracer.transcoder.single_layer_transcoder import (
        load_gemma_scope_2_transcoder,
        load_gemma_scope_transcoder,
    )
    from safetensors.torch import save_file

    folder = out / "circuit_tracer" / "plt_gemma_scope"
    folder.mkdir(parents=True, exist_ok=True)
    rand = lambda *shape: 0.3 * torch.randn(*shape, generator=generator)  # noqa: E731
    np.savez(folder / "layer_0.npz", W_enc=rand(D_IN, D_SAE).numpy(), W_dec=rand(D_SAE, D_IN).numpy(),
             b_enc=rand(D_SAE).numpy(), b_dec=rand(D_IN).numpy(), threshold=rand(D_SAE).numpy())
    save_file({"w_enc": rand(D_IN, D_SAE), "w_dec": rand(D_SAE, D_IN), "b_enc": rand(D_SAE), "b_dec": rand(D_IN),
               "threshold": rand(D_SAE), "affine_skip_connection": rand(D_IN, D_IN)},
              str(folder / "layer_1.safetensors"))
    config = {"model_name": MODEL, "model_kind": "transcoder_set", "feature_input_hook": "ln2.hook_normalized",
              "feature_output_hook": "hook_mlp_out", "transcoders": ["layer_0.npz", "layer_1.safetensors"]}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    layers = [load_gemma_scope_transcoder(str(folder / "layer_0.npz"), 0, device=cpu),
              load_gemma_scope_2_transcoder(str(folder / "layer_1.safetensors"), 1, device=cpu)]
    with torch.no_grad():
        acts = torch.stack([t.encode(x[layer]) for layer, t in enumerate(layers)])
        recon = torch.stack([t.decode(acts[layer], x[layer]) for layer, t in enumerate(layers)])
    manifest["circuit_tracer/plt_gemma_scope"] = {
        "format": "circuit_tracer", "folder": "circuit_tracer/plt_gemma_scope",
        "reference": save_reference(out, "circuit_tracer/plt_gemma_scope", x, acts, recon),
        "note": "Gemma Scope 1 / 2 layer files written here in Google's layouts, listed in config.yaml; reference: "
                "circuit-tracer's load_gemma_scope_transcoder / load_gemma_scope_2_transcoder, encode, decode"}
    folder = out / "circuit_tracer" / "clt"
    clt = CrossLayerTranscoder(2, D_SAE, D_IN, activation_function="jump_relu", lazy_decoder=False, device=cpu,
                               dtype=torch.float32)
    randomize(clt, generator, threshold_scale=0.1)
    clt.to_safetensors(str(folder))
    config = {"model_name": MODEL, "model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
              "feature_output_hook": "hook_mlp_out", "scan": "tiny-clt"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_clt(str(folder), "hook_resid_mid", "hook_mlp_out", device=cpu, dtype=torch.float32,
                      lazy_decoder=False)
    with torch.no_grad():
        acts = loaded.encode(x)
        recon = loaded.decode(acts)
    assert recon.shape == (2, N_X, D_IN), "circuit-tracer sizes the reconstruction by the last active position"
    manifest["circuit_tracer/clt"] = {
        "format": "circuit_tracer", "folder": "circuit_tracer/clt",
        "reference": save_reference(out, "circuit_tracer/clt", x, acts, recon),
        "note": "written by circuit-tracer (CrossLayerTranscoder.to_safetensors); reference: load_clt, encode, "
                "decode; x, acts and out are [layer N ...]"}
    return manifest


# ------------------------------------------------------------------------------------------------ saelens reads
def write_with_resid(out: Path) -> None:
    """Every fixture SAELens can express, written by resid, with resid's encode / decode of the fixture's x."""
    from safetensors.torch import load_file, save_file

    import resid.dictionaries
    from resid.dictionaries.formats import saelens

    manifest = json.loads((DATA / "manifest.json").read_text())["fixtures"]
    for name, entry in manifest.items():
        factor = 2.5 if name.endswith("expected_average") else None
        loaded = resid.dictionaries.load(DATA / entry["folder"], hook=entry.get("hook"), norm_scaling_factor=factor)
        if isinstance(loaded, list):
            continue
        target = out / name.replace("/", "__")
        try:
            saelens.write(loaded, target)
        except resid.ResidError as err:
            print(f"skipped {name}: {err}")
            continue
        x = load_file(str(DATA / entry["reference"]))["x"]
        acts, recon = loaded(x)
        save_file({"x": x, "acts": acts, "out": recon}, str(out / f"{target.name}.expected.safetensors"))


def saelens_compare(folder: Path) -> int:
    """Load each resid-written folder with SAELens and compare with resid's outputs; the number of mismatches."""
    import torch
    from sae_lens import SAE
    from safetensors.torch import load_file

    bad = 0
    for expected_path in sorted(folder.glob("*.expected.safetensors")):
        expected = load_file(str(expected_path))
        sae = SAE.load_from_disk(folder / expected_path.name.removesuffix(".expected.safetensors"))
        x = expected["x"]
        heads = sae.cfg.reshape_activations == "hook_z"
        inputs = x.reshape(x.shape[0], 4, -1) if heads else x
        with torch.no_grad():
            acts = sae.encode(inputs)
            recon = (sae.forward(inputs) if hasattr(sae, "W_skip") else sae.decode(acts)).reshape(x.shape[0], -1)
        gaps = [float((acts - expected["acts"]).abs().max()), float((recon - expected["out"]).abs().max())]
        # the tests' criterion (torch.testing.assert_close, rtol = atol = 1e-6): skip paths multiply by W_skip in
        # another memory layout than SAELens, which rounds differently
        ok = all(bool(((a - expected[k]).abs() <= TOLERANCE + TOLERANCE * expected[k].abs()).all())
                 for a, k in ((acts, "acts"), (recon, "out")))
        bad += not ok
        print(f"{'ok  ' if ok else 'BAD '} {expected_path.name.removesuffix('.expected.safetensors'):40s} "
              f"{type(sae).__name__:24s} max |acts - resid| {gaps[0]:.2g}, max |out - resid| {gaps[1]:.2g}")
    return bad


# ------------------------------------------------------------------------------------------------------ compare
def compare(new: Path, old: Path) -> list[str]:
    """Mismatches between two fixture trees' reference outputs (beyond TOLERANCE) and fixture lists."""
    from safetensors.torch import load_file

    new_manifest = json.loads((new / "manifest.json").read_text())["fixtures"]
    old_manifest = json.loads((old / "manifest.json").read_text())["fixtures"]
    problems = [] if set(new_manifest) == set(old_manifest) else ["the fixture lists differ"]
    for name in sorted(set(new_manifest) & set(old_manifest)):
        a = load_file(str(new / new_manifest[name]["reference"]))
        b = load_file(str(old / old_manifest[name]["reference"]))
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or a[key].shape != b[key].shape:
                problems.append(f"{name}: {key} differs in presence or shape")
            elif (gap := float((a[key] - b[key]).abs().max())) > TOLERANCE:
                problems.append(f"{name}: {key} differs by {gap:.3g}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="regenerate elsewhere and compare; write nothing")
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)  # in the venv: generate into this folder
    parser.add_argument("--compare", type=Path, nargs=2, help=argparse.SUPPRESS)  # in the venv: NEW OLD
    parser.add_argument("--saelens-reads", action="store_true", help="check that SAELens reads what resid writes")
    parser.add_argument("--saelens-compare", type=Path, help=argparse.SUPPRESS)  # in the venv: resid-written DIR
    args = parser.parse_args()
    if args.saelens_compare is not None:
        sys.exit(1 if saelens_compare(args.saelens_compare) else 0)
    if args.saelens_reads:
        with tempfile.TemporaryDirectory() as scratch:
            write_with_resid(Path(scratch))
            sys.exit(subprocess.run([str(ensure_venv()), __file__, "--saelens-compare", scratch]).returncode)
    if args.inside is not None:
        generate(args.inside)
        return
    if args.compare is not None:
        problems = compare(*args.compare)
        for line in problems:
            print("MISMATCH", line)
        print("agrees with" if not problems else "DISAGREES with", args.compare[1])
        sys.exit(1 if problems else 0)
    python = ensure_venv()
    # PYTHONHASHSEED: SAELens orders some cfg.json keys by set iteration; fixed, regenerating changes no byte
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPARSIFY_DISABLE_TRITON": "1", "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "dictionaries"
        subprocess.run([str(python), __file__, "--inside", str(target)], check=True, env=env)
        if args.check and not DATA.exists():
            sys.exit(f"{DATA} does not exist: nothing to check against; run without --check to create it")
        if DATA.exists():
            agrees = subprocess.run([str(python), __file__, "--compare", str(target), str(DATA)]).returncode == 0
            if args.check:
                sys.exit(0 if agrees else 1)
        shutil.rmtree(DATA, ignore_errors=True)
        shutil.copytree(target, DATA)
        print("wrote", DATA)


if __name__ == "__main__":
    main()
