"""The frozen values of one prompt's run: what turns the model into the local replacement model's linear maps.

    values        every block's `frozen_sites()` (resid.components.block) -> its value in the run, batch axis
                  dropped, float32: Site(l, "attn", field="pattern") [head pos key_pos], Site(l, part,
                  field="norm_scale" | "post_norm_scale") [pos 1]
    final_scale   the final norm's scale [pos 1] (what readout.frozen / readout.frozen_adjoint take)

The maps themselves are the components' own (Block.frozen / frozen_adjoint, Attention.frozen, Norm.frozen,
Readout.frozen, Unembed.frozen): this module holds values, not algebra. `truncated(n)` keeps the first n positions,
which is exact under causal attention (a cotangent at positions below n never reaches later ones).
"""

from dataclasses import dataclass

from torch import Tensor

from resid.capture import Capture
from resid.sites import Site


@dataclass(frozen=True)
class Frozen:
    values: dict[Site, Tensor]
    final_scale: Tensor  # [pos 1]

    @staticmethod
    def capture(model) -> Capture:
        """What a run must record for `of`: every block's frozen sites, the embeddings and the final norm scale
        (and nothing else: a sublayer's `out` is not needed)."""
        fields: dict[str, set[str]] = {"attn": set(), "mlp": set()}
        for block in model.blocks:
            for site in block.frozen_sites():
                fields[site.part].add(site.what)
        return Capture(attn=fields["attn"], mlp=fields["mlp"], embed=True, final_norm_scale=True)

    @classmethod
    def of(cls, model, run) -> "Frozen":
        """The frozen values of the first prompt of `run` (captured with `capture(model)`)."""
        values = {site: run.read(site)[0].float() for block in model.blocks for site in block.frozen_sites()}
        return cls(values, run.stream.final_norm_scale[0].float())

    @property
    def n_pos(self) -> int:
        return int(self.final_scale.shape[0])

    def truncated(self, n_pos: int) -> "Frozen":
        """The values at the first n_pos positions (queries and keys of a pattern)."""
        if n_pos == self.n_pos:
            return self
        return Frozen({site: value[:, :n_pos, :n_pos] if site.what == "pattern" else value[:n_pos]
                       for site, value in self.values.items()}, self.final_scale[:n_pos])
