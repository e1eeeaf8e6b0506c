"""The attention-pattern view, as TransformerLens users know it from CircuitsVis: one layer's heads over one prompt's
tokens, interactive in a notebook (`_repr_html_`) and as a self-contained page (`write`), from a Run or from inputs.

    view = attention_view.view(model, "When Mary and John went to the store, John gave a drink to", layer=5)
    view                        # in a notebook: the view itself
    view.write("layer5.html")   # the same as a page: no network, no libraries

The page shows each head's pattern as a thumbnail (rows are queries, columns keys; click one to select it), the
selected head large (hover a cell for its query, key and probability), and the prompt's tokens: hovering a token
colours every token by how much the selected head at that position reads it (click to pin). Only the prompt's real
tokens are shown (a padded batch's padding is left out), so position 0 is the prompt's first token.

The script is package data (attention_view.js), read once and inlined into each view.
"""

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from jaxtyping import Float
from torch import Tensor

from resid.analyses.checks import select_heads, select_layers
from resid.analyses.inputs import prompts
from resid.analyses.io import atomic
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.run import Run
from resid.tokenizer import Tokens

MAX_POSITIONS = 512  # a page holds heads x pos^2 probabilities: 9 heads at 512 tokens are ~20 MB of HTML


@dataclass(frozen=True)
class AttentionView:
    """One layer's attention patterns over one prompt (real tokens only), ready to show."""

    layer: int
    heads: tuple[int, ...]
    tokens: tuple[str, ...]
    patterns: Float[Tensor, "head pos key_pos"]  # float32, on the CPU
    title: str = ""

    def __repr__(self) -> str:
        return (f"AttentionView(layer={self.layer}, heads={list(self.heads)}, {len(self.tokens)} tokens; "
                "shown in a notebook, or .write(path) for a page)")

    def fragment(self) -> str:
        """The view as an HTML fragment (its data, markup, style and script), as a notebook shows it."""
        data = {"title": self.title, "layer": self.layer, "heads": list(self.heads), "tokens": list(self.tokens),
                "patterns": self.patterns.round(decimals=4).tolist()}
        return (f"<div data-attention-view class='resid-attention'><style>{_STYLE}</style>"
                f"<div class='title'>{html.escape(self.title)}</div><div class='thumbs'></div>"
                "<div class='selected'></div><canvas class='big'></canvas><div class='text'></div>"
                "<div class='readout'></div>"
                f"<script type='application/json' class='attention-data'>{_embedded(data)}</script>"
                f"<script>{_script()}</script></div>")

    def _repr_html_(self) -> str:
        return self.fragment()

    def page(self) -> str:
        """A self-contained HTML page of the view."""
        title = html.escape(self.title or f"layer {self.layer} attention")
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
                f"<body style='font-family:sans-serif;margin:12px'>{self.fragment()}</body></html>")

    def write(self, path: str | Path) -> Path:
        """Write the page to `path` (atomically; its folder is created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write(path, self.page())
        return path


def view(model: Transformer, inputs: Run | str | Tokens | Tensor | Sequence[str], layer: int,
          heads: Sequence[int] | None = None, prompt: int = 0) -> AttentionView:
    """The view of `layer`'s attention heads (`heads`, default all) over prompt `prompt` of `inputs`: a Run that
    captured the layer's pattern (e.g. Capture.all(), or Capture(layers=[layer], attn={"pattern"})), or anything
    `model.run` takes (then run here, capturing just that pattern)."""
    [layer] = select_layers(model, layer)
    chosen = select_heads(model, heads)
    tokens = inputs.tokens if isinstance(inputs, Run) else prompts(model, inputs).tokens
    _check_prompt(prompt, tokens.ids.shape[0])
    real = tokens.attention_mask[prompt].cpu()
    if int(real.sum()) > MAX_POSITIONS:
        raise ResidError(f"The prompt has {int(real.sum())} tokens; an attention view shows at most {MAX_POSITIONS} "
                         "(its page holds heads x tokens^2 probabilities). View a shorter prompt or its last "
                         f"{MAX_POSITIONS} tokens.")
    if isinstance(inputs, Run):
        run = inputs
    else:
        tokens, prompt = tokens.rows([prompt]).trim(), 0
        run = model.run(tokens, capture=Capture(layers=[layer], attn={"pattern"}, embed=False))
        real = tokens.attention_mask[0].cpu()
    pattern = run.stream.layers[layer].attn.pattern[prompt].detach().float().cpu()  # [head pos key_pos]
    if pattern.shape[1] != tokens.ids.shape[1]:
        raise ResidError(f"The run kept the pattern at {pattern.shape[1]} of its {tokens.ids.shape[1]} positions; "
                         "the view needs every position: run with Capture(positions=None).")
    index = real.nonzero().squeeze(-1)
    patterns = pattern[list(chosen)][:, index][:, :, index]
    ids = tokens.ids[prompt].cpu()[index].tolist()
    strs = model.to_str_tokens(ids) if model.tokenizer is not None else [f"<{i}>" for i in ids]
    title = f"{model.name}: layer {layer}" + (f", heads {list(chosen)}" if heads is not None else "")
    return AttentionView(layer, chosen, tuple(strs), patterns.contiguous(), title)


def _check_prompt(prompt: int, n: int) -> None:
    if not isinstance(prompt, int) or isinstance(prompt, bool) or not 0 <= prompt < n:
        raise ResidError(f"{param('prompt')} must be a prompt index in 0..{n - 1}; got {prompt!r}.")


def _embedded(value) -> str:  # JSON inside <script>: "</" must not close the tag
    return json.dumps(value).replace("</", "<\\/")


def _script() -> str:
    return resources.files("resid.analyses").joinpath("attention_view.js").read_text(encoding="utf-8")


_STYLE = (".resid-attention .thumbs{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0}"
          ".resid-attention .thumb{cursor:pointer;text-align:center;font-size:12px;padding:3px;border:2px solid "
          "transparent}.resid-attention .thumb.on{border-color:#2166ac}.resid-attention .thumb canvas{width:96px;"
          "height:96px;image-rendering:pixelated;border:1px solid #ddd}.resid-attention canvas.big{border:1px solid "
          "#ddd;image-rendering:pixelated}.resid-attention .text{margin:8px 0;line-height:1.9;font-family:monospace;"
          "white-space:pre-wrap}.resid-attention .token{padding:2px 1px;border:1px solid #eee;cursor:pointer}"
          ".resid-attention .token.query{outline:2px solid #b2182b}.resid-attention .readout{font-size:13px;"
          "color:#333;min-height:1.4em}.resid-attention .title{font-weight:bold}")
