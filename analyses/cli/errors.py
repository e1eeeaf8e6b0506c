"""How an analysis's errors name parameters on the command line: each parameter the analyses name through
`resid.errors.param` is mapped here to its flag, and main renders every command's errors with it
(`resid.errors.param_style`). No message text is rewritten afterwards, so rewording a message cannot break its
command-line form; a parameter with no flag keeps its Python spelling, and advice only a Python caller can follow
(`python_only`) is left out.
"""

from resid.errors import unset

# parameter -> flag; a parameter named without a value may read differently (DESCRIBED)
FLAGS = {
    "reference": "--reference", "method": "--method", "metric": "--metric", "level": "--level", "norm": "--norm",
    "sites": "--sites", "sign": "--sign", "device": "--device", "dtype": "--dtype",
    "mean_positions": "--mean-positions",
    "target": "--target", "baseline": "--baseline", "positions": "--positions", "position": "--pos",
    "every": "--every",
    "batch_size": "--batch-size", "k": "--k", "align": "--align", "direction": "--direction", "layout": "--layout",
    "features": "--features", "dictionary": "--dictionary",
    "steps": "--steps", "tokens_per_step": "--tokens-per-step", "seq_len": "--seq-len", "precision": "--precision",
    "max_n_logits": "--max-n-logits", "desired_logit_prob": "--desired-logit-prob",
}
# (parameter, value) -> a switch, a flag that takes no value: check_unembedding=False is --skip-unembedding-check
SWITCHES = {("check_unembedding", False): "--skip-unembedding-check"}
DESCRIBED = {"reference": "--reference FILE", "baselines": 'a "baseline" on every line of --prompts'}


def render(name: str, value: object) -> str | None:
    """The command line's spelling of a parameter (with its value: `--method mean`), or None for the Python one."""
    if value is unset():
        return DESCRIBED.get(name, FLAGS.get(name))
    if isinstance(value, bool) and (name, value) in SWITCHES:
        return SWITCHES[name, value]
    flag = FLAGS.get(name)
    if flag is None:
        return None
    shown = str(value).removeprefix("torch.")  # a dtype: --dtype float32
    return f"{flag} {shown}"
