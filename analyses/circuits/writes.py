"""What one run of a decoder (or one stack of an encoder-decoder) wrote and read, the reference an edge-patched pass
(resid.analyses.circuits.patched) swaps in: every writer's output and every reader group's input, or their means over
the real positions (mean ablation).
"""

from dataclasses import dataclass

from jaxtyping import Float, Shaped
from torch import Tensor


@dataclass(frozen=True)
class Writes:
    """Every writer's output in one run, as the run computed it: the embeddings' sum [n pos d_model], each layer's
    head mixes z [n pos head d_head] (a head writes z[h] @ W_O[h]; under post-norms empty) and MLP writes [n pos
    d_model]; each layer's whole attention write `attn` [n pos d_model] (under post-norms the writer; where it was
    recorded, what a pass that skips the attention puts in: EdgePass); a decoder's cross-attention heads' z
    `cross`. And what the readers read in it (`reads`; a decoder-only run's, from
    patched.plain_writes): each layer's attention input (resid_pre) and MLP input (resid_mid, or resid_pre in a parallel
    block), the final residual; the run's last-token logits where it computed them. A mean reference holds
    [1 1 ...] tensors (and no logits)."""

    embed: Float[Tensor, "n pos d_model"]
    z: tuple[Float[Tensor, "n pos head d_head"], ...]
    mlp: tuple[Float[Tensor, "n pos d_model"], ...]
    attn: tuple[Float[Tensor, "n pos d_model"], ...] = ()
    cross: tuple[Float[Tensor, "n pos head d_head"], ...] = ()  # a decoder's cross-attention heads' z
    attn_read: tuple[Float[Tensor, "n pos d_model"], ...] = ()
    mlp_read: tuple[Float[Tensor, "n pos d_model"], ...] = ()
    final: Float[Tensor, "n pos d_model"] | None = None
    logits: Float[Tensor, "n d_vocab"] | None = None

    @property
    def computed(self) -> bool:
        """Whether these are one run's writes, each computed from that run's reads (a mean's are not: a node reading
        the mean input does not write the mean write)."""
        return self.logits is not None

    @property
    def reads(self) -> bool:
        """Whether it holds what every reader read (plain_writes'; an encoder-decoder's stacks' hold none)."""
        return self.final is not None

    def read(self, layer: int | None, field: str) -> Float[Tensor, "n pos d_model"]:
        """What a reader group (a layer's q, k, v, kv or MLP; the logits, layer None) reads."""
        return self.final if layer is None else self.mlp_read[layer] if field == "mlp" else self.attn_read[layer]

    def mean(self, mask: Shaped[Tensor, "n pos"]) -> "Writes":
        """Mean ablation's reference: every write (and read: their sum) averaged over the real positions of every
        prompt (`mask`: the attention mask, any dtype)."""
        weight = mask.to(self.embed.dtype)
        total = weight.sum()

        def average(t: Tensor) -> Tensor:
            w = weight.view(*weight.shape, *([1] * (t.dim() - 2)))
            return ((t * w).sum((0, 1)) / total)[None, None]

        return Writes(average(self.embed), tuple(map(average, self.z)), tuple(map(average, self.mlp)),
                      tuple(map(average, self.attn)), tuple(map(average, self.cross)),
                      tuple(map(average, self.attn_read)), tuple(map(average, self.mlp_read)),
                      None if self.final is None else average(self.final))
