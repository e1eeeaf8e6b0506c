"""EAP with integrated gradients (EAP-IG; Hanna et al. 2024): EAP's gradient averaged over `steps` points on the
way from the corrupt run to the clean one (alpha = 1/steps, 2/steps, ..., 1, as the reference implementation
takes them), which follows the metric where it is not linear in one edge:

    score(w, r) = sum over positions of (reference_w - clean_w) . mean_k d metric / d input_r (alpha_k)

on="inputs" (the paper's default): the point alpha is the model run on the embeddings corrupt + alpha (clean -
corrupt); on="activations": every edge's term interpolated at once (each reader reads its clean input plus
(1 - alpha) times its edges' corrupt - clean differences; resid.analyses.circuits.patched with keep = alpha).
"""

from collections.abc import Callable, Sequence

import pandas as pd

from resid.analyses.checks import check_choice
from resid.analyses.circuits.eap import gradient_batches
from resid.analyses.circuits.inputs import pairs_of
from resid.analyses.circuits.scores import edge_scores
from resid.analyses.circuits.seq2seq import Model, decoder_only
from resid.analyses.distributed.execution import Execution, as_execution
from resid.errors import ResidError, param
from resid.model import Inputs

ON = ("inputs", "activations")


def eap_ig(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    steps: int = 5,
    on: str = "inputs",
    execution: Execution | None = None,
) -> pd.DataFrame:
    """EAP-IG scores of every edge (the table of resid.analyses.circuits.eap.eap), `steps` forward and backward
    passes per batch of pairs, interpolating the inputs or the activations (`on`)."""
    decoder_only(model, "EAP-IG")
    check_choice(on, "on", ON)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ResidError(f"{param('steps')} must be a positive whole number of integration steps, got {steps!r}.")
    pairs = pairs_of(model, clean, corrupt, targets, baselines, metric)
    alphas = tuple(k / steps for k in range(1, steps + 1))
    return edge_scores(model, pairs, f"eap_ig_{on}", gradient_batches(alphas, on), {"steps": steps, "on": on},
                       as_execution(execution))
