"""Regenerate tuned-lens-reads-resid/, the oracle of tests/analyses/test_tuned_lens_formats.py's
test_tuned_lens_reads_a_lens_resid_wrote: a lens written by resid in tuned-lens's layout, loaded by tuned-lens
itself, and the logits tuned-lens computes with it.

    .venv/bin/python tests/data/make_tuned_lens_reads_resid.py            # rewrite the committed files
    .venv/bin/python tests/data/make_tuned_lens_reads_resid.py --check    # regenerate elsewhere and compare

Run it with resid's .venv: resid writes the lens there (resid.analyses.lenses.formats.write, layout="tuned-lens",
seeded random translators for the tiny Llama of tests/data/tuned-lens/model, so that a misread weight shows). Then
tuned-lens 0.2.0 runs in its own environment (build/tuned-lens-venv, the pins of make_tuned_lens_reference.py; this
script re-runs itself there with --inside and never imports resid there): transformers loads the model,
`TunedLens.from_model_and_pretrained(model, lens/)` loads resid's files, and the logits of `lens(hidden_states[i],
idx=i)` on the input ids of tests/data/tuned-lens/reference.safetensors are saved (float32, [layer batch pos
d_vocab]) as reference.safetensors. tuned-lens's LICENSE (MIT) is copied beside them.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "tuned-lens-reads-resid"
MODEL = HERE / "tuned-lens" / "model"
INPUTS = HERE / "tuned-lens" / "reference.safetensors"
SEED = 7
TOLERANCE = 1e-5  # --check: largest |difference| of any logit


def write_lens(out: Path) -> None:
    """In resid's environment: seeded random translators for every layer input, written in tuned-lens's layout."""
    import torch

    import resid
    from resid.analyses import logit_lens
    from resid.analyses.lenses import Translators, formats

    model = resid.load(MODEL)
    sites = logit_lens.site_list(model, "layer")[:-1]
    d = model.config.d_model
    generator = torch.Generator().manual_seed(SEED)
    translators = Translators(tuple(sites), 0.2 * torch.randn(len(sites), d, d, generator=generator),
                              0.5 * torch.randn(len(sites), d, generator=generator), "layer",
                              # the model named by its place in the repository, not this machine's path to it
                              {"model": "tests/data/tuned-lens/model", "unembed_hash": formats.unembed_hash(model)})
    formats.write(translators, out / "lens", layout="tuned-lens")


def tuned_lens_logits(out: Path) -> dict:
    """In tuned-lens's environment: tuned-lens loads the lens resid wrote and computes its logits."""
    import importlib.metadata
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from tuned_lens.nn.lenses import TunedLens

    model = transformers.LlamaForCausalLM.from_pretrained(MODEL).eval()
    lens = TunedLens.from_model_and_pretrained(model, str(out / "lens")).eval()
    ids = load_file(str(INPUTS))["input_ids"]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[:-1]
        logits = torch.stack([lens(h, idx=i) for i, h in enumerate(hidden)])
    versions = {name: importlib.metadata.version(name) for name in ("tuned-lens", "transformers", "torch")}
    metadata = {"source": f"tuned-lens {versions['tuned-lens']}, transformers {versions['transformers']}, torch "
                          f"{versions['torch']}", "note": "[layer batch pos d_vocab] logits of TunedLens(hidden_"
                          "states[i], idx=i), the lens loaded from resid's lens/"}
    save_file({"input_ids": ids, "tuned_logits": logits.float().contiguous()}, str(out / "reference.safetensors"),
              metadata=metadata)
    licence = importlib.metadata.distribution("tuned-lens").locate_file("tuned_lens-0.2.0.dist-info/LICENSE")
    shutil.copy(licence, out / "LICENSE")
    return metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--venv", type=Path, default=HERE.parents[1] / "build" / "tuned-lens-venv")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)  # in tuned-lens's environment
    args = parser.parse_args()
    if args.inside is not None:
        print(json.dumps(tuned_lens_logits(args.inside)))
        return
    from make_tuned_lens_reference import PINS, TORCH
    from reference_venv import build_venv

    python = build_venv(args.venv, TORCH, PINS)
    target = args.venv / "reads-resid-check" if args.check else OUT
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    write_lens(target)
    subprocess.run([str(python), __file__, "--inside", str(target)], check=True)
    if args.check:
        import torch
        from safetensors.torch import load_file

        gap = (load_file(str(target / "reference.safetensors"))["tuned_logits"] -
               load_file(str(OUT / "reference.safetensors"))["tuned_logits"]).abs().max().item()
        print(f"max |difference| of tuned-lens's logits: {gap:.3g}")
        new, old = (torch.load(where / "lens" / "params.pt", weights_only=True) for where in (target, OUT))
        same = new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)
        sys.exit(0 if gap <= TOLERANCE and same else 1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
