"""Interventions in a lens's coordinates (Gurnee et al. 2026, Methods), as edits of the one forward: each function
returns a resid.Hook at a residual site, to pass to `model.run(..., interventions=[...])` (or any analysis that takes
interventions). They work for every lens; the J-lens is the one they were made for.

Glossary: the *lens vector* of token t at site s is the unembedding column W_U[:, t] (before the final norm's gain,
as TransformerLens reads it) pulled back through the lens's linear part onto the residual at s (Lens.direction):
    logit lens   v_t = W_U[:, t]        tuned lens   v_t = (I + A_s)^T W_U[:, t]        J-lens   v_t = J_s^T W_U[:, t]
so h . v_t is what the lens's linear map carries into token t's unembedding. The *lens coordinates* of h on tokens
T = (t_1 .. t_k) are c = V^+ h with V = [v_t1 .. v_tk] [d_model k] (the pseudoinverse: the least-squares
coefficients of h in span V).

    steer(lens, site, token, alpha)         h + alpha * median_pos |h| * v_t / |v_t|   (the norm is each prompt's median
                                            over the edited positions, so a prompt's edit does not depend on its batch)
    ablate(lens, site, tokens)              h - Q Q^T h, Q an orthonormal basis of span V: no projection on any v_t
    swap(lens, site, source, target, alpha) h + alpha V (sigma(c) - c), sigma exchanging the two coordinates
    patch(lens, site, tokens, values)       h + V (values - c): the coordinates set to `values` (e.g. a donor run's,
                                            `coordinates(...)`), the rest of h (orthogonal to span V) untouched

Every edit is computed in float32 and returned in the model's dtype; positions: the Site's (prompt-relative) or all.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.lenses.lens import Lens
from resid.analyses.vocab import Token, token_ids
from resid.errors import ResidError
from resid.interventions import Hook
from resid.readout import Direction
from resid.sites import RESID_PARTS, Site


def lens_vectors(lens: Lens, site: Site, tokens: Token | Sequence[Token]) -> Float[Tensor, "token d_model"]:
    """The lens vectors of `tokens` at `site` (see the module docstring), float32 on the model's device."""
    model = lens.model
    given = list(tokens) if isinstance(tokens, list | tuple) else [tokens]
    ids = token_ids(model, given, len(given), "token")
    columns = model.readout.unembedding(through_norm=False)[:, ids].float().T  # [token d_model]
    plain = Site(site.layer, site.part)
    lens.check_site(plain)
    pulled, _ = lens.direction(Direction(columns, torch.zeros(len(ids), device=columns.device)), plain)
    return pulled.vector


def coordinates(lens: Lens, site: Site, tokens: Sequence[Token], resid: Float[Tensor, "*batch d_model"]
                ) -> Float[Tensor, "*batch token"]:
    """The lens coordinates V^+ h of residuals at `site` on `tokens` (float32)."""
    return resid.float() @ torch.linalg.pinv(lens_vectors(lens, site, list(tokens)).T).T


def steer(lens: Lens, site: Site, token: Token, alpha: float = 4.0) -> Hook:
    """A Hook adding token's unit lens vector, scaled by alpha times each prompt's median residual norm."""
    _residual(site)
    unit = lens_vectors(lens, site, token)[0]
    unit = unit / unit.norm()

    def edit(resid: Tensor, tokens) -> Tensor:
        h = resid.float()
        scale = alpha * h.norm(dim=-1).median(dim=-1, keepdim=True).values  # [batch 1]
        return (h + scale[..., None] * unit).to(resid.dtype)

    return Hook(site, edit)


def ablate(lens: Lens, site: Site, tokens: Token | Sequence[Token]) -> Hook:
    """A Hook projecting the span of the tokens' lens vectors out of the residual."""
    _residual(site)
    vectors = lens_vectors(lens, site, tokens)
    basis, _ = torch.linalg.qr((vectors / vectors.norm(dim=-1, keepdim=True)).T)  # [d_model token], orthonormal

    def edit(resid: Tensor, tokens) -> Tensor:
        h = resid.float()
        return (h - (h @ basis) @ basis.T).to(resid.dtype)

    return Hook(site, edit)


def swap(lens: Lens, site: Site, source: Token, target: Token, alpha: float = 1.0) -> Hook:
    """A Hook exchanging the lens coordinates of `source` and `target` (alpha=2: the paper's double strength)."""
    _residual(site)
    vectors = lens_vectors(lens, site, [source, target]).T  # V [d_model 2]
    inverse = torch.linalg.pinv(vectors)  # [2 d_model]

    def edit(resid: Tensor, tokens) -> Tensor:
        h = resid.float()
        c = h @ inverse.T
        return (h + alpha * (c.flip(-1) - c) @ vectors.T).to(resid.dtype)

    return Hook(site, edit)


def patch(lens: Lens, site: Site, tokens: Sequence[Token], values: Float[Tensor, "*batch token"]) -> Hook:
    """A Hook setting the lens coordinates on `tokens` to `values` (broadcast to [batch pos token]; e.g. a donor run's
    `coordinates`), leaving the part of the residual orthogonal to their lens vectors as it is."""
    _residual(site)
    vectors = lens_vectors(lens, site, list(tokens)).T  # V [d_model token]
    inverse = torch.linalg.pinv(vectors)
    if values.shape[-1] != vectors.shape[1]:
        raise ResidError(f"patch sets {vectors.shape[1]} coordinates (one per token) but values has "
                         f"{values.shape[-1]} on its last axis.")
    values = values.float().to(vectors.device)

    def edit(resid: Tensor, tokens) -> Tensor:
        h = resid.float()
        return (h + (values - h @ inverse.T) @ vectors.T).to(resid.dtype)

    return Hook(site, edit)


def _residual(site: Site) -> None:
    if not isinstance(site, Site) or site.part not in RESID_PARTS:
        raise ResidError(f"Lens interventions edit a residual site ({', '.join(RESID_PARTS)}), e.g. "
                         f"Site(3, 'resid_post'); got {site!r}.")
