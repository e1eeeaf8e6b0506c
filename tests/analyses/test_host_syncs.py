"""Host synchronisations of the sweep hot paths, counted on the CPU (tests/host_syncs.py): one batch of an ablation
sweep, of exact patching, of attribution patching (AtP), of path patching and of direct logit attribution by head
asks the host for a fixed number of values, whatever the number of rows, sites, heads or layers in it.

Each test runs the analysis once to warm what is computed once per model (the identity provenance records), then
counts one call with few rows and one with many, in one batch of prompts (batch_size large enough for every row of a
layer to go through one forward pass). Where the number of forward passes is the same (more sites or rows of the same
layers), the whole counts must be equal. Where it is not (more layers: one resumed pass per layer; more sender sets:
one pass each), the syncs this package's own code makes (analyses/) must be equal; what the core's forward pass asks
per pass (resid/) is that pass's concern and bounded by FORWARD_SYNCS."""

import pytest
import torch
from host_syncs import HostSyncs
from random_models import make_random_model

from resid import Site
from resid.analyses import Execution, ablation, attribution, patching
from resid.batching import ACCELERATOR_TOKENS_PER_BATCH, MAX_BATCH, model_batch_size

BATCH = Execution(batch_size=256, progress=False)  # every prompt in one group, every row of a layer in one pass
N_PROMPTS, N_POS = 4, 7
FORWARD_SYNCS = 4  # at most what the core asks per forward pass (token range, padding, finite values)


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 97, (N_PROMPTS, N_POS), generator=torch.Generator().manual_seed(seed))


CLEAN, CORRUPT = _ids(1), _ids(2)
TARGETS, BASELINES = CLEAN[:, 0].tolist(), CLEAN[:, 1].tolist()


def counted(fn) -> HostSyncs:
    fn()  # warm: the model's identity (provenance) is hashed on the first call only
    with HostSyncs() as syncs:
        fn()
    return syncs


def ours(syncs: HostSyncs) -> int:
    """The syncs made by this package's analyses (not by the core's forward pass)."""
    return sum(n for place, n in syncs.calls.items() if place.startswith("analyses/"))


def same_count(few: HostSyncs, many: HostSyncs) -> None:
    assert many.count == few.count, f"few rows: {few.count} ({few.where()})\nmany rows: {many.count} ({many.where()})"


def same_own_count(few: HostSyncs, many: HostSyncs) -> None:
    assert ours(many) == ours(few), f"few: {ours(few)} ({few.where()})\nmany: {ours(many)} ({many.where()})"


@pytest.fixture(scope="module")
def model(gpt2_tokenizer):
    return make_random_model("llama_gqa", gpt2_tokenizer, n_layers=3)  # a tokenizer: mean ablation reads texts


def heads(config, per_layer: int) -> list[Site]:
    return [Site(l, "attn", head=h) for l in range(config.n_layers) for h in range(per_layer)]


def positions(config, per_layer: int) -> list[Site]:
    return [Site(l, "resid_pre", positions=(p,)) for l in range(config.n_layers) for p in range(per_layer)]


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_an_ablation_sweeps_syncs_do_not_grow_with_its_heads(model, method) -> None:
    reference = ["a reference text", "another one"] if method == "mean" else None
    sweep = lambda sites: lambda: ablation.sweep(model, CLEAN, TARGETS, BASELINES, sites=sites,  # noqa: E731
                                                 method=method, reference=reference, execution=BATCH)
    same_count(counted(sweep(heads(model.config, 1))), counted(sweep(heads(model.config, 4))))


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_an_ablation_sweeps_syncs_do_not_grow_with_its_positions(model, method) -> None:
    reference = ["a reference text that is long enough", "another one, as long as that"] if method == "mean" else None
    sweep = lambda sites: lambda: ablation.sweep(model, CLEAN, TARGETS, BASELINES, sites=sites,  # noqa: E731
                                                 method=method, reference=reference, execution=BATCH)
    same_count(counted(sweep(positions(model.config, 1))), counted(sweep(positions(model.config, N_POS))))


def test_an_ablation_sweeps_own_syncs_do_not_grow_with_its_layers() -> None:
    found = []
    for n_layers in (2, 5):
        deeper = make_random_model("llama_gqa", n_layers=n_layers)
        found.append(counted(lambda deeper=deeper: ablation.sweep(deeper, CLEAN, TARGETS, BASELINES, sites="head",
                                                                  execution=BATCH)))
    same_own_count(*found)
    assert found[1].count - found[0].count <= FORWARD_SYNCS * 3, f"{found[0].where()}\n{found[1].where()}"


def test_exact_patchings_syncs_do_not_grow_with_its_sites(model) -> None:
    patch = lambda sites: lambda: patching.activation(model, CLEAN, CORRUPT, TARGETS, BASELINES,  # noqa: E731
                                                      sites=sites, execution=BATCH)
    same_count(counted(patch(heads(model.config, 1))), counted(patch(heads(model.config, 4))))
    same_count(counted(patch(positions(model.config, 1))), counted(patch(positions(model.config, N_POS))))


def test_aligned_patchings_syncs_do_not_grow_with_its_positions(model) -> None:
    shorter = CORRUPT[:, 2:]  # pairs of different lengths, aligned from their last tokens
    patch = lambda sites: lambda: patching.activation(model, CLEAN, shorter, TARGETS, BASELINES,  # noqa: E731
                                                      sites=sites, align="end", execution=BATCH)
    few = [Site(l, "resid_pre", positions=(N_POS - 1,)) for l in range(3)]
    many = [Site(l, "resid_pre", positions=(p,)) for l in range(3) for p in range(2, N_POS)]
    same_count(counted(patch(few)), counted(patch(many)))


@pytest.mark.parametrize("method", ["atp", "atp*"])
def test_attribution_patchings_syncs_do_not_grow_with_its_sites(model, method) -> None:
    atp = lambda sites: lambda: patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES,  # noqa: E731
                                             sites=sites, method=method, execution=BATCH)
    few, many = counted(atp("sublayer")), counted(atp(["resid_pre", "sublayer", "head", "q", "k", "v"]))
    if method == "atp":
        same_count(few, many)
    else:  # AtP*'s query / key fix rebuilds each layer's pattern (Transformer.attention_pattern, the core's)
        same_own_count(few, many)


def test_attribution_patchings_syncs_do_not_grow_with_its_layers() -> None:
    found = []
    for n_layers in (2, 5):
        deeper = make_random_model("llama_gqa", n_layers=n_layers)
        found.append(counted(lambda deeper=deeper: patching.atp(deeper, CLEAN, CORRUPT, TARGETS, BASELINES,
                                                                sites=["resid_pre", "sublayer", "head"],
                                                                execution=BATCH)))
    same_count(*found)


def test_path_patchings_own_syncs_do_not_grow_with_its_sender_sets(model) -> None:
    path = lambda sets: lambda: patching.path(model, CLEAN, CORRUPT, TARGETS, BASELINES,  # noqa: E731
                                              senders=sets, execution=BATCH)
    few = counted(path([Site(0, "attn", head=0)]))
    many = counted(path([Site(l, "attn", head=h) for l in range(3) for h in range(4)] + [[Site(1, "mlp")]]))
    same_own_count(few, many)
    assert many.count - few.count <= FORWARD_SYNCS * 12, f"{few.where()}\n{many.where()}"


def test_head_dlas_syncs_do_not_grow_with_its_components(model) -> None:
    dla = lambda level: lambda: attribution.direct(model, CLEAN, TARGETS, BASELINES, level=level)  # noqa: E731
    same_count(counted(dla("sublayer")), counted(dla("head")))
    same_count(counted(dla("head")), counted(dla("neuron")))


def test_head_dlas_own_syncs_do_not_grow_with_its_layers() -> None:
    found = []
    for n_layers in (2, 5):
        deeper = make_random_model("llama_gqa", n_layers=n_layers)
        found.append(counted(lambda deeper=deeper: attribution.direct(deeper, CLEAN, TARGETS, BASELINES,
                                                                      level="head")))
    same_own_count(*found)


def test_short_prompts_batch_hundreds_of_rows_on_the_cpu_and_more_on_an_accelerator(model) -> None:
    """The sweeps' automatic batch (resid.batching.model_batch_size): 15-token prompts (IOI) go hundreds of rows to a
    forward pass on the CPU, and on another device (here `meta`, whose memory is not known: no memory bound) are
    limited by tokens, not by the CPU's constant."""
    on_cpu = model_batch_size(model, 15)
    assert 256 <= on_cpu <= MAX_BATCH
    elsewhere = model_batch_size(make_random_model("llama_gqa", n_layers=3).to("meta"), 15)
    assert elsewhere == ACCELERATOR_TOKENS_PER_BATCH // 15 > MAX_BATCH
    assert model_batch_size(make_random_model("llama_gqa", n_layers=3).to("meta"), 4096) == MAX_BATCH
