"""`attribute(model, prompt, transcoders)`: the attribution graph of a prompt's next-token prediction.

    1. replace   run the prompt with every MLP replaced by its transcoder (error kept), freeze patterns and norm
                 scales (resid.analyses.graphs.replacement)
    2. logits    the logit nodes: the most likely next tokens until their probabilities sum to
                 `desired_logit_prob`, at most `max_n_logits`; each reads logit - mean logit
    3. rows      the direct effect of every source on each logit, then on each active feature, in batches of
                 execution.batch_size targets per backward sweep ("auto": SWEEP_TARGETS;
                 resid.analyses.graphs.edges). With `max_feature_nodes`
                 below the number of active features, features are visited in order of their influence on the
                 logits as far as the rows computed so far tell it (recomputed every `update_interval` batches),
                 and the graph keeps the visited ones, as circuit-tracer does. The sweeps run on
                 execution's executor (resid.analyses.graphs.rows): in this process, or on Ray workers, one
                 model each, the batches the same either way, so the graph is too (to float32 rounding)

Every edge is exact for the local replacement model: with the freezes the model is linear in the node writes, and
the rows are computed through its transposed maps, not estimated. metadata["replacement_logit_error"] is the
check that the frozen model is the model at this prompt: the largest difference between its logits, run forward
from the node writes (resid.analyses.graphs.replay), and the model's (float32 rounding).
"""

import time

import torch

from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.graphs.edges import Sweeper
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.replacement import Replacement, replace
from resid.analyses.graphs.replay import replay
from resid.analyses.graphs.rows import Batch, RowSweeps
from resid.analyses.graphs.visiting import every_row, most_influential_rows
from resid.batching import available_bytes
from resid.errors import ResidError, param

SWEEP_TARGETS = 64  # targets per backward sweep for batch_size="auto" (the graph's fixed batch before Execution)
ROWS_SHARE = 0.25  # of the host's available memory the rows may take: assembling the graph copies them


@torch.no_grad()
def attribute(model, prompt, transcoders, *, max_n_logits: int = 10, desired_logit_prob: float = 0.95,
              max_feature_nodes: int | None = None, update_interval: int = 4, skip_bos: bool | None = None,
              execution: Execution | None = None) -> Graph:
    """The attribution graph of `prompt`'s prediction at its last position through `transcoders` (per-layer
    transcoders, one per layer in any order, or a cross-layer transcoder). skip_bos: position 0's features and
    errors are no nodes (their writes are constants); None (default): when the prompt starts with the tokenizer's
    BOS token. (circuit-tracer 0.5.0 always treats position 0 so: pass skip_bos=True to match it.)
    execution (resid.analyses.Execution): batch_size is the targets per backward sweep ("auto": SWEEP_TARGETS);
    executor / workers run the sweeps there (e.g. Execution(executor="ray", workers=2): each worker loads the model
    and runs the replacement once, then sweeps batches of rows); the graph is assembled in this process and
    returned (Graph.to_json keeps it), so it takes no out."""
    execution = as_execution(execution)
    if execution.out is not None:
        raise ResidError("An attribution graph is one object, assembled in this process and returned (Graph.to_json "
                         "writes it), not table rows a store could resume: its Execution takes batch_size (targets "
                         "per backward sweep), executor, workers and progress; drop out.")
    batch_size = SWEEP_TARGETS if execution.batch_size == "auto" else execution.batch_size
    if max_n_logits < 1:
        raise ResidError(f"{param('max_n_logits', max_n_logits)} must be at least 1.")
    if not 0 < desired_logit_prob <= 1:
        raise ResidError(f"{param('desired_logit_prob', desired_logit_prob)} is a probability in (0, 1].")
    if max_feature_nodes is not None and max_feature_nodes < 0:
        raise ResidError(f"{param('max_feature_nodes', max_feature_nodes)} must be at least 0 (None: every feature).")
    if update_interval < 1:
        raise ResidError(f"{param('update_interval', update_interval)} must be at least 1.")
    if isinstance(prompt, str) and not prompt:
        raise ResidError("The prompt is empty: an attribution graph traces the prediction that follows a prompt, so "
                         "it needs at least one token. Give a prompt such as 'The capital of France is'.")
    with execution.started() as execution:  # before the replacement run: a bad executor is refused at once
        started = time.perf_counter()
        rep = replace(model, prompt, transcoders, skip_bos=skip_bos)
        tokens, probs, vectors = salient_logits(model, rep, max_n_logits, desired_logit_prob)
        tokens, probs = tokens.cpu(), probs.cpu()  # bookkeeping on the CPU; the sweeps run on the model's device
        sweeper = Sweeper(rep)
        sweeps = RowSweeps(model, rep, sweeper, execution)  # in process, its own replacement serves every batch
        logits = [Batch(logits=chunk.cpu()) for chunk in vectors.split(batch_size)]
        n_features = sweeper.n_features
        limit = n_features if max_feature_nodes is None else min(max_feature_nodes, n_features)
        rows_fit(len(tokens), limit, sweeper.n_sources, max_n_logits, desired_logit_prob)
        if limit == n_features:
            rows, selected = every_row(sweeps, logits, batch_size), torch.arange(n_features)
        else:  # the ranking starts from the logit rows
            rows, selected = most_influential_rows(sweeps, torch.cat(sweeps.all(logits)), probs, limit, batch_size,
                                                   update_interval)
    layers, uncapped = rep.n_layers, rep.uncapped
    # the check that the frozen linear model is the model here: its logits from the node writes
    replay_error = float((replay(rep)[1][-1] - uncapped).abs().max())
    return Graph(
        model_name=model.name, token_ids=rep.token_ids.cpu(), token_strs=token_strs(model, rep.token_ids),
        n_layers=layers, features=rep.features[selected].cpu(), activations=rep.activations[selected].cpu(),
        pre_activations=rep.pre_activations[selected].cpu(), active_features=rep.features.cpu(),
        logit_tokens=tokens, logit_probabilities=probs,
        logit_values=(uncapped[tokens] - uncapped.mean()).cpu(), logit_strs=token_strs(model, tokens),
        rows=rows,
        transcoders=rep.transcoders.name, skip_bos=rep.skip_bos,
        metadata={"seconds": time.perf_counter() - started, "n_active_features": n_features,
                  "batch_size": batch_size, "max_feature_nodes": max_feature_nodes,
                  "replacement_logit_error": replay_error},
    )


def rows_fit(n_logits: int, n_rows: int, n_sources: int, max_n_logits: int, desired_logit_prob: float) -> None:
    """Refuse, before they are allocated, the graph's rows ([feature rows + logits, sources + logits] float32 on the
    host) where they would take more than ROWS_SHARE of the host's available memory: a flat next-token distribution
    makes tens of thousands of logit nodes, and the rows grow with their square."""
    size = 4 * (n_rows + n_logits) * (n_sources + n_logits)
    free = available_bytes(torch.device("cpu"))
    if free is not None and size > ROWS_SHARE * free:
        raise ResidError(
            f"The graph would have {n_logits:,} logit nodes (the most probable next tokens until their probabilities "
            f"sum to {param('desired_logit_prob', desired_logit_prob)}, at most {param('max_n_logits', max_n_logits)}) "
            f"and {n_rows:,} feature rows: {size / 2**30:,.1f} GiB of rows, more than {ROWS_SHARE:.0%} of the "
            f"{free / 2**30:,.1f} GiB available. Lower {param('max_n_logits')} (circuit-tracer's default is 10) or "
            f"{param('desired_logit_prob')}.")


def sweep_batch_size(execution: Execution | None, auto: int) -> int:
    """Targets per backward sweep from `execution` (`auto` for "auto") for a head split (resid.analyses.graphs.heads),
    which is assembled in this process and returned: an out is refused."""
    execution = as_execution(execution)
    if execution.out is not None:
        raise ResidError("A head split is built in this process and returned: its Execution takes batch_size "
                         "(targets per backward sweep), executor, workers and progress; drop out.")
    return auto if execution.batch_size == "auto" else execution.batch_size


def salient_logits(model, rep: Replacement, max_n_logits: int, desired_logit_prob: float):
    """(token ids, probabilities, read-out vectors [k d_model]: logit_vectors)."""
    probs = torch.softmax(rep.logits, dim=-1)
    top_p, top = torch.topk(probs, min(max_n_logits, probs.shape[0]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), torch.tensor(desired_logit_prob, device=top_p.device))) + 1
    top_p, top = top_p[:cutoff], top[:cutoff]
    return top, top_p, logit_vectors(model, top)


def logit_vectors(model, tokens: torch.Tensor) -> torch.Tensor:
    """[k d_model]: what each logit node reads after the final norm, W_U[:, t] - mean_v W_U (its value is its logit
    minus the mean logit)."""
    w_u = model.readout.unembedding(through_norm=False)  # [d_model d_vocab]
    return (w_u[:, tokens.to(w_u.device)] - w_u.mean(1, keepdim=True)).T


def token_strs(model, ids: torch.Tensor) -> list[str]:
    """Each token id as its text (the id itself for a model without a tokenizer)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]) for i in ids]
