"""Fixtures of SAELens and Gemma Scope for tests/data/make_dictionary_reference.py (run inside its venv)."""

import json
from pathlib import Path

from make_dictionary_reference import D_IN, D_SAE, MODEL, N_X, randomize, save_reference


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
    # TopK with rescale_acts_by_decoder_norm=True, saved as trained (decoder norms not 1), then the same SAE after
    # SAELens's fold_W_dec_norm (the flag stays set, the norms become 1): both compute the same. Their own
    # generator, so that the fixtures above stay byte for byte what they were.
    generator = torch.Generator().manual_seed(3)
    sae = TopKSAE(TopKSAEConfig(**sae_kw("blocks.1.hook_resid_pre", k=4, rescale_acts_by_decoder_norm=True)))
    randomize(sae, generator)
    for name, note in (("topk_rescaled", "SAE.save_model"), ("topk_rescaled_folded", "fold_W_dec_norm, save_model")):
        if name == "topk_rescaled_folded":
            sae.fold_W_dec_norm()
        sae.save_model(out / "saelens" / name)
        manifest[f"saelens/{name}"] = _saelens_reference(
            out, f"saelens/{name}", SAE.load_from_disk(out / "saelens" / name), x, {},
            f"written by SAELens (TopKSAE, rescale_acts_by_decoder_norm=True, {note}); reference: "
            "SAE.load_from_disk, then encode / decode")
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
