"""Regenerate tests/data/dictionaries/: tiny dictionaries in every format resid reads, and each reference
library's own encode / decode of fixed inputs, the oracle of tests/dictionaries/test_reference.py.

    python tests/data/make_dictionary_reference.py            # build the venv if needed, rewrite the fixtures
    python tests/data/make_dictionary_reference.py --check    # regenerate elsewhere, compare, write nothing
    .venv/bin/python tests/data/make_dictionary_reference.py --saelens-reads   # SAELens reads what resid writes
    python tests/data/make_dictionary_reference.py --releases # rewrite resid/dictionaries/releases.json

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
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests import this file as a module
    from reference_venv import build_venv

    return build_venv(VENV, "torch==2.13.0", PINS)


# ------------------------------------------------------------------------------------------------------ inside
# The fixtures of each library are built in dictionary_reference_saelens.py (SAELens, Gemma Scope) and
# dictionary_reference_others.py (sparsify, circuit-tracer), beside this file.
def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"libraries": {p.split("==")[0]: md.version(p.split("==")[0]) for p in PINS},
                "torch": torch.__version__, "fixtures": {}}
    from dictionary_reference_others import circuit_tracer_fixtures, sparsify_fixtures
    from dictionary_reference_saelens import gemma_scope_fixtures, saelens_fixtures

    for fixtures in (saelens_fixtures, gemma_scope_fixtures, sparsify_fixtures, circuit_tracer_fixtures):
        manifest["fixtures"].update(fixtures(out))
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


# ----------------------------------------------------------------------------------------------------- releases
# The main SAELens releases resid resolves without sae-lens installed (resid.dictionaries.releases): Gemma Scope 1's
# canonical sets, Gemma Scope 2's res / mlp sets, GPT-2 small res-jb, Llama Scope
RELEASES = r"^(gemma-scope-(2b|9b|27b)-(pt|it)-(res|mlp|att)-canonical|gemma-scope-2-[^-]+-(pt|it)-(res|mlp)" \
           r"|gpt2-small-res-jb|llama_scope_lx[ram]_(8x|32x))$"


def write_releases(registry: Path, out: Path) -> None:
    """releases.json: the RELEASES entries of sae-lens's pretrained_saes.yaml, with the fields resid reads."""
    import importlib.metadata as md
    import re

    import yaml

    found = yaml.safe_load(registry.read_text())
    keep = lambda sae: {k: sae[k] for k in ("id", "path", "norm_scaling_factor") if k in sae}  # noqa: E731
    releases = {name: {"repo_id": entry["repo_id"], "model": entry.get("model"),
                       "conversion_func": entry.get("conversion_func"), "saes": [keep(s) for s in entry["saes"]]}
                for name, entry in sorted(found.items()) if re.match(RELEASES, name)}
    source = (f"sae-lens=={md.version('sae-lens')} sae_lens/pretrained_saes.yaml (MIT licence, (c) Joseph Bloom; "
              "https://github.com/decoderesearch/SAELens), the releases matching " + RELEASES)
    lines = [f' "source": {json.dumps(source)},', ' "releases": {']
    for i, (name, entry) in enumerate(releases.items()):  # one line per SAE: a reviewable diff when it changes
        head = {k: v for k, v in entry.items() if k != "saes"}
        saes = ",\n".join(f"   {json.dumps(s)}" for s in entry["saes"])
        comma = "," if i < len(releases) - 1 else ""
        lines.append(f'  {json.dumps(name)}: {json.dumps(head)[:-1]}, "saes": [\n{saes}\n  ]}}{comma}')
    out.write_text("{\n" + "\n".join(lines) + "\n }\n}\n")
    print(f"wrote {out}: {len(releases)} releases, {sum(len(e['saes']) for e in releases.values())} SAEs")


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
    parser.add_argument("--releases", action="store_true", help="rewrite resid/dictionaries/releases.json")
    parser.add_argument("--releases-inside", action="store_true", help=argparse.SUPPRESS)  # in the venv
    args = parser.parse_args()
    if args.releases_inside:
        import importlib.util

        registry = Path(importlib.util.find_spec("sae_lens").submodule_search_locations[0]) / "pretrained_saes.yaml"
        write_releases(registry, ROOT / "resid" / "dictionaries" / "releases.json")
        return
    if args.releases:
        sys.exit(subprocess.run([str(ensure_venv()), __file__, "--releases-inside"]).returncode)
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
