"""Decoding feature activations: the sparse decode a run uses when few features are active, and what a change of
the activations writes (the splices of resid.dictionaries.attach and its feature edits)."""

from torch import Tensor

from resid.dictionaries.dictionary import Dictionary

SPARSE_DECODE_BELOW = 0.05  # decode from the active features alone when fewer than this fraction is non-zero


def decode(d: Dictionary, acts: Tensor, x: Tensor) -> Tensor:
    """d.decode(acts, x), reading only the decoder rows of active features when few are: b_dec plus, per token,
    the sum of a_i * W_dec[i] over its active features (about l0 / d_sae of the dense matmul's work). Equal to the
    dense decode up to float32 summation order."""
    if d.normalize_activations != "none" or not acts.numel() or \
            bool(acts.count_nonzero() >= SPARSE_DECODE_BELOW * acts.numel()):
        return d.decode(acts, x)
    flat = acts.reshape(-1, acts.shape[-1])
    token, feature = flat.nonzero(as_tuple=True)
    writes = flat[token, feature].float()[:, None] * d.W_dec.float()[feature]
    out = d.b_dec.float().expand(flat.shape[0], -1).clone().index_add_(0, token, writes)
    out = out.view(*acts.shape[:-1], -1)
    if d.W_skip is not None:
        out = out + x.float() @ d.W_skip.float()
    return out.to(acts.dtype)


def write_of(d: Dictionary, delta: Tensor, x: Tensor) -> Tensor:
    """What a change of the activations changes in the reconstruction: delta @ W_dec, the input normalization
    undone (b_dec and the skip path do not change)."""
    out = delta.float() @ d.W_dec.float()
    if d.normalize_activations != "none":
        _, scale, shift = d._normalize(x)
        out = out / scale if shift is None else out * scale
    return out.to(delta.dtype)
