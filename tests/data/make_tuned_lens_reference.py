"""Regenerate tuned-lens/, the oracle for tests/analyses/test_tuned_lens_formats.py: a lens written by the
`tuned-lens` package itself and what tuned-lens computes with it.

    python tests/data/make_tuned_lens_reference.py            # rewrite the committed files
    python tests/data/make_tuned_lens_reference.py --check    # compare with them, write nothing; exit 1 on mismatch

tuned-lens runs in a virtual environment of its own (default build/tuned-lens-venv, made on first use), never in
resid's: tuned-lens 0.2.0 (its last release, 2023) needs what resid's environment has moved past. Pins, each for
a reason:
    torch==2.13.0        first, alone: installed by tuned-lens's requirements it would pull a multi-GB CUDA build
    tuned-lens==0.2.0    the release on PyPI
    transformers==4.46.3 tuned-lens 0.2.0 passes load_in_8bit to from_pretrained, which transformers 5 refuses
    datasets==3.1.0      the last datasets that accepts transformers 4.46's huggingface_hub (< 1.0)
    torchdata==0.8.0     tuned-lens's training loop imports torchdata.dataloader2, removed in torchdata 0.9

The oracle: a tiny random Llama (transformers, saved as config.json + model.safetensors, no tokenizer: the tests
pass token ids), `tuned_lens.TunedLens.from_model(model)` with its translators set to seeded random values (a fresh
lens is all zeros, which would test nothing), saved by `TunedLens.save` (config.json + params.pt), and per layer i
< n_layers the logits of `lens(hidden_states[i], idx=i)` and of `LogitLens.from_model(model)` on fixed token ids
(reference.safetensors; float32). tuned-lens's LICENSE (MIT) is copied beside them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "tuned-lens"
VENV = Path(__file__).resolve().parents[2] / "build" / "tuned-lens-venv"
PINS = ["tuned-lens==0.2.0", "transformers==4.46.3", "datasets==3.1.0", "torchdata==0.8.0"]
TORCH = "torch==2.13.0"
SEED = 0
N_BATCH, N_POS = 2, 8
TOLERANCE = 1e-5  # --check: largest |difference| of any logit


def reference(out: Path) -> dict:
    """Runs inside the tuned-lens environment: writes model/, lens/ and reference.safetensors into `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.metadata

    import torch
    import transformers
    from safetensors.torch import save_file
    from tuned_lens.nn.lenses import LogitLens, TunedLens

    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # a large spread, so that a misread gain or transposed translator shows in the logits
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    model.save_pretrained(out / "model", safe_serialization=True)
    lens = TunedLens.from_model(model)
    with torch.no_grad():
        for translator in lens:
            translator.weight.copy_(0.2 * torch.randn(translator.weight.shape, generator=generator))
            translator.bias.copy_(0.5 * torch.randn(translator.bias.shape, generator=generator))
    lens.save(out / "lens")
    logit_lens = LogitLens.from_model(model)
    ids = torch.randint(0, config.vocab_size, (N_BATCH, N_POS), generator=generator)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[:-1]  # layer inputs, as tuned-lens trains
        tuned = torch.stack([lens(h, idx=i) for i, h in enumerate(hidden)])
        logit = torch.stack([logit_lens(h, idx=i) for i, h in enumerate(hidden)])
    versions = {name: importlib.metadata.version(name) for name in ("tuned-lens", "transformers", "torch")}
    metadata = {"source": f"tuned-lens {versions['tuned-lens']}, transformers {versions['transformers']}, torch "
                          f"{versions['torch']}; seed {SEED}", "note": "[layer batch pos d_vocab] logits of "
                          "TunedLens(hidden_states[i], idx=i) and LogitLens for i < num_hidden_layers"}
    tensors = {"input_ids": ids, "tuned_logits": tuned.float().contiguous(), "logit_logits": logit.float().contiguous()}
    save_file(tensors, str(out / "reference.safetensors"), metadata=metadata)
    licence = importlib.metadata.distribution("tuned-lens").locate_file("tuned_lens-0.2.0.dist-info/LICENSE")
    shutil.copy(licence, out / "LICENSE")
    return metadata


def compare(new: Path, old: Path) -> bool:
    """Logits within TOLERANCE, lens and model files' tensors equal."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(new / "reference.safetensors")), load_file(str(old / "reference.safetensors"))
    ok = torch.equal(a["input_ids"], b["input_ids"])
    for key in ("tuned_logits", "logit_logits"):
        gap = (a[key] - b[key]).abs().max().item()
        print(f"max |difference| {key}: {gap:.3g}")
        ok = ok and gap <= TOLERANCE
    lens_a = torch.load(new / "lens" / "params.pt", weights_only=True)
    lens_b = torch.load(old / "lens" / "params.pt", weights_only=True)
    ok = ok and lens_a.keys() == lens_b.keys() and all(torch.equal(lens_a[k], lens_b[k]) for k in lens_a)
    print("agrees with" if ok else "DISAGREES with", old)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--venv", type=Path, default=VENV, help="tuned-lens's environment (made if missing)")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)  # the run in that environment
    args = parser.parse_args()
    if args.inside is not None:
        print(json.dumps(reference(args.inside)))
        return
    from reference_venv import build_venv  # beside this script (sys.path[0] when it runs)

    python = build_venv(args.venv, TORCH, PINS)
    target = OUT if not args.check else Path(args.venv) / "check"
    if args.check:
        shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(python), __file__, "--inside", str(target)], check=True)
    if args.check:
        sys.exit(0 if compare(target, OUT) else 1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
