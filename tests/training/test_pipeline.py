"""The activation pipeline and the training loop on a tiny random model: the buffer holds exactly the real tokens
(no padding, no BOS unless asked), several dictionaries from one forward pass train as each would alone, a run
killed mid-way and resumed ends with the uninterrupted run's weights, and the result runs in model.run and loads
back from its SAELens folder."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from numerics import TINY
from safetensors import safe_open
from safetensors.torch import save_file

import resid
from resid.analyses.distributed.execution import Execution
from resid.analyses.training.activations import Activations, forward_batches
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.dictionaries.hooks import HookPoint, point_of, read
from resid.sites import Site

SITE = Site(1, "resid_post")
HOOK = "blocks.1.hook_resid_post"  # its TransformerLens name: the dictionary's name and SAELens folder


def _point(model, site: Site) -> HookPoint:
    return point_of(site, model.config)


def _rows_alone(model, source: Activations, block: int, point: HookPoint, keep_bos: bool) -> torch.Tensor:
    """The block's tokens, each window run alone (no padding), its first position dropped unless kept."""
    rows = []
    for w in source.windows_of(block):
        run = model.run(torch.as_tensor(w.ids)[None], capture=resid.Capture.all())
        rows.append(read(run, model, point)[0, 0 if keep_bos else 1:])
    return torch.cat(rows)


@pytest.mark.parametrize("keep_bos", [False, True])
def test_the_buffer_holds_the_real_tokens_and_no_padding_or_bos(bos_model, texts, keep_bos: bool) -> None:
    source = Activations(bos_model, texts, [SITE], batch_size=64, window=24, forward_batch=5, buffer_tokens=200,
                         keep_bos=keep_bos)
    point = _point(bos_model, SITE)
    found = source.block(1)[point]
    alone = _rows_alone(bos_model, source, 1, point, keep_bos)
    assert found.shape == alone.shape  # padding would add rows, a dropped BOS would remove some
    distance = torch.cdist(found, alone)  # the same rows, shuffled (two tokens may have the same activations)
    torch.testing.assert_close(found, alone[distance.argmin(1)], **TINY)
    torch.testing.assert_close(alone, found[distance.argmin(0)], **TINY)
    bos_row = read(bos_model.run(torch.tensor([[50256]]), capture=resid.Capture.all()), bos_model, point)[0, 0]
    assert bool(torch.isclose(found, bos_row, **TINY).all(1).any()) == keep_bos


@pytest.mark.parametrize("keep_bos", [False, True])
def test_without_bos_the_first_token_of_each_window_is_dropped_unless_kept(plain_model, texts, keep_bos) -> None:
    source = Activations(plain_model, texts, [SITE], batch_size=64, window=24, forward_batch=5, buffer_tokens=200,
                         keep_bos=keep_bos)
    windows = source.windows_of(1)
    assert not any(w.bos for w in windows)  # the tokenizer prepends nothing: each window's first token is the sink
    point = _point(plain_model, SITE)
    found = source.block(1)[point]
    alone = _rows_alone(plain_model, source, 1, point, keep_bos)
    assert len(found) == len(alone) == sum(len(w) - (not keep_bos) for w in windows)
    distance = torch.cdist(found, alone)
    torch.testing.assert_close(found, alone[distance.argmin(1)], **TINY)
    firsts = torch.cat([read(plain_model.run(torch.as_tensor(w.ids[:1])[None], capture=resid.Capture.all()),
                             plain_model, point)[0] for w in windows])
    assert bool((torch.cdist(firsts, found).min(1).values < 1e-4).any()) == keep_bos


def test_a_transcoders_input_and_output_rows_are_the_same_tokens(bos_model, texts) -> None:
    point_in, point_out = Spec.transcoder(bos_model, 1).points(bos_model)
    source = Activations(bos_model, texts, [point_in, point_out], batch_size=64, window=24, buffer_tokens=150)
    block = source.block(0)
    alone_in = _rows_alone(bos_model, source, 0, point_in, False)
    alone_out = _rows_alone(bos_model, source, 0, point_out, False)
    match = torch.cdist(block[point_in], alone_in).argmin(1)  # which token each shuffled row is
    torch.testing.assert_close(block[point_out], alone_out[match], **TINY)


RECIPE = Recipe(activation="topk", k=4, d_sae=64, steps=9, batch_size=96, warmup_steps=2, dead_tokens=200)
OPTIONS = dict(window=24, buffer_tokens=100)
QUIET = Execution(batch_size=4, progress=False)  # 4 windows per forward pass


def _in(folder) -> Execution:
    return Execution(batch_size=4, progress=False, out=folder)


def _weights(dictionaries) -> list[dict[str, torch.Tensor]]:
    return [{k: v.detach().clone() for k, v in d.state_dict().items()} for d in dictionaries]


def test_several_dictionaries_from_one_forward_train_as_each_alone(bos_model, texts) -> None:
    specs = [Spec(Site(0, "resid_post")), Spec.transcoder(bos_model, 2)]
    recipe = Recipe(activation="batchtopk", k=4, d_sae=64, steps=6, batch_size=96, warmup_steps=2,
                    threshold_start_step=2)
    together = _weights(train(bos_model, texts, specs, recipe, QUIET, **OPTIONS))
    alone = [_weights(train(bos_model, texts, [s], recipe, QUIET, **OPTIONS))[0] for s in specs]
    for both, one in zip(together, alone):
        assert both.keys() == one.keys()
        for name in both:
            assert torch.equal(both[name], one[name]), name


class Killed(Exception):
    pass


def test_a_killed_run_resumes_to_the_uninterrupted_weights(bos_model, texts, tmp_path) -> None:
    def kill(step, stats):
        if step == 7:
            raise Killed

    specs = [SITE, Spec("layers[0].resid_post", name="early")]
    with pytest.raises(Killed):
        train(bos_model, texts, specs, RECIPE, dataclasses.replace(_in(tmp_path), checkpoint_every=3), on_step=kill,
              **OPTIONS)
    resumed_from = []
    with pytest.warns(DeprecationWarning, match=r"train\(\.\.\., checkpoint_every=\.\.\.\) is deprecated"):
        resumed = train(bos_model, texts, specs, RECIPE, _in(tmp_path), checkpoint_every=3,  # as before Execution's
                        on_step=lambda step, stats: resumed_from.append(step), **OPTIONS)
    assert resumed_from[0] == 7  # it went on from the checkpoint of step 6, not from the start
    straight = train(bos_model, texts, specs, RECIPE, QUIET, **OPTIONS)
    for a, b in zip(_weights(resumed), _weights(straight)):
        for name in a:
            assert torch.equal(a[name], b[name]), name
    # the saved folder loads back and encodes as the trained dictionary does
    loaded = resid.dictionaries.load(tmp_path / HOOK, bos_model)
    x = torch.randn(5, bos_model.config.d_model)
    torch.testing.assert_close(loaded.encode(x), resumed[0].encode(x), **TINY)
    run = bos_model.run(texts[:2], dictionaries=resumed)
    assert set(run.dictionaries) == {HOOK, "early"}


def test_a_checkpoint_written_before_specs_held_sites_resumes(bos_model, texts, tmp_path) -> None:
    """Its settings name each Spec by TransformerLens hook (hook_in, hook_out), as resid wrote them before."""
    def kill(step, stats):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        train(bos_model, texts, [SITE], RECIPE, _in(tmp_path), checkpoint_every=3, on_step=kill, **OPTIONS)
    path = str(tmp_path / "checkpoint.safetensors")
    with safe_open(path, framework="pt") as handle:
        metadata, tensors = handle.metadata(), {name: handle.get_tensor(name) for name in handle.keys()}
    settings = json.loads(metadata["settings"])
    assert settings["specs"] == [{"site_in": "layers[1].resid_post", "site_out": None, "standardized": False,
                                  "skip": False, "name": None}]
    settings["specs"] = [{"hook_in": HOOK, "hook_out": None, "skip": False, "name": None}]
    save_file(tensors, path, metadata={**metadata, "settings": json.dumps(settings, sort_keys=True)})
    resumed_from = []
    resumed = train(bos_model, texts, [SITE], RECIPE, _in(tmp_path),
                    on_step=lambda step, stats: resumed_from.append(step), **OPTIONS)
    assert resumed_from[0] == 4  # from the old checkpoint of step 3
    straight = train(bos_model, texts, [SITE], RECIPE, QUIET, **OPTIONS)
    for name, value in straight[0].state_dict().items():
        assert torch.equal(resumed[0].state_dict()[name], value), name


def test_other_settings_do_not_resume(bos_model, texts, tmp_path) -> None:
    train(bos_model, texts, [SITE], RECIPE, _in(tmp_path), checkpoint_every=3, **OPTIONS)
    with pytest.raises(resid.ResidError, match="other settings"):
        train(bos_model, texts, [SITE], dataclasses.replace(RECIPE, activation="relu"), _in(tmp_path), **OPTIONS)


HOLDER = """
import sys
from resid.analyses.io.checkpoints import StateStore
store = StateStore(sys.argv[1], "resid.training.checkpoint", "training", {})
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_folder_another_process_trains_into_is_refused(bos_model, texts, tmp_path) -> None:
    """The checkpoint store holds <folder>.lock, the result store's lock: a second writer is refused by name."""
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        with pytest.raises(resid.ResidError, match=rf"Another process \(pid {first.pid}.*{tmp_path / 'run'}.lock"):
            train(bos_model, texts, [SITE], RECIPE, _in(tmp_path / "run"), **OPTIONS)
    finally:
        first.communicate("done\n", timeout=60)
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_forward_batches_cut_where_padding_plus_overhead_is_least() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        lengths = sorted(torch.randint(1, 60, (int(torch.randint(1, 9, (), generator=g)),), generator=g).tolist(),
                         reverse=True)
        most = int(torch.randint(40, 200, (), generator=g))

        def cost(spans):
            return sum((end - start) * lengths[start] + 40 for start, end in spans)

        spans = forward_batches(lengths, most)
        assert [s for s, _ in spans] == [0] + [e for _, e in spans[:-1]] and spans[-1][1] == len(lengths)
        assert all(e - s == 1 or (e - s) * lengths[s] <= most for s, e in spans)  # the memory bound holds
        best = None
        for mask in range(2 ** (len(lengths) - 1)):  # every partition into consecutive spans, by brute force
            cuts = [0] + [i + 1 for i in range(len(lengths) - 1) if mask >> i & 1] + [len(lengths)]
            candidate = list(zip(cuts, cuts[1:]))
            if all(e - s == 1 or (e - s) * lengths[s] <= most for s, e in candidate):
                best = cost(candidate) if best is None else min(best, cost(candidate))
        assert cost(spans) == best


def test_autocast_gives_the_same_tokens_within_bf16(bos_model, texts) -> None:
    points = [_point(bos_model, SITE), *Spec.transcoder(bos_model, 1).points(bos_model)]
    exact = Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150).block(0)
    bf16 = Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150, autocast=True).block(0)
    for point in points:
        assert bf16[point].dtype == torch.float32 and bf16[point].shape == exact[point].shape
        assert not torch.equal(bf16[point], exact[point])  # the products did run in bf16
        error = (bf16[point] - exact[point]).norm(dim=-1) / exact[point].norm(dim=-1)  # the same rows and order
        assert float(error.mean()) < 0.03 and float(error.max()) < 0.2, point.name  # bf16's 3 digits, 2 layers


def test_tokens_far_above_the_median_norm_are_left_out(bos_model, texts) -> None:
    points = [_point(bos_model, SITE), *Spec.transcoder(bos_model, 1).points(bos_model)]
    first = points[0]
    every = Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150, max_norm_ratio=None)
    some = Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150, max_norm_ratio=1.1)
    everything, kept = every.block(0), some.block(0)
    ordinary = torch.stack([t.norm(dim=-1) <= 1.1 * t.norm(dim=-1).median() for t in everything.values()]).all(0)
    assert 0 < len(kept[first]) == int(ordinary.sum()) < len(everything[first])  # one mask for every point
    for point in points:  # the same rows (in another order): the ordinary ones, aligned across the points
        distance = torch.cdist(kept[first], everything[first][ordinary])
        torch.testing.assert_close(kept[point], everything[point][ordinary][distance.argmin(1)], **TINY)
    with pytest.raises(resid.ResidError, match=r"max_norm_ratio=0\.5 must be a number above 1 \(a multiple of the "
                                               r"median norm\), or None to keep every token"):
        Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150, max_norm_ratio=0.5)


def test_a_buffer_larger_than_free_memory_is_refused_before_any_work(bos_model, texts, monkeypatch) -> None:
    from resid.analyses.training import activations

    points = Spec.transcoder(bos_model, 1).points(bos_model)
    source = Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150)
    need = source.buffer_bytes()
    assert need == max(source.tokens_per_block()) * 2 * bos_model.config.d_model * 4
    monkeypatch.setattr(activations, "available_bytes", lambda device: need)  # 80% of it is too little
    with pytest.raises(resid.ResidError, match=r"lower buffer_tokens=150 to at most \d+"):
        Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150)
    monkeypatch.setattr(activations, "available_bytes", lambda device: 2 * need)
    Activations(bos_model, texts, points, batch_size=64, window=24, buffer_tokens=150)
