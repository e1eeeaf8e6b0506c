"""Fixtures of sparsify and circuit-tracer for tests/data/make_dictionary_reference.py (run inside its venv)."""

from pathlib import Path

from make_dictionary_reference import D_IN, D_SAE, MODEL, N_X, randomize, save_reference


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
