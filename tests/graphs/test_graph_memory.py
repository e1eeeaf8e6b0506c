"""Memory of a long prompt's graph grows linearly with the number of active features: a tiny model at 2,048
positions, its graph (at most 64 feature nodes, as circuit-tracer's max_feature_nodes) built in a fresh process
with transcoders of two sparsities. The model's own run (the same in both) cancels in the difference of the peaks;
what is left must stay under a per-feature bound (the rows of the visited features, their copies during the
influence ranking, the decoder layout), far below what anything quadratic in the features would take (4 bytes x
n_active^2: gigabytes here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, resource, sys
import torch
from resid.analyses import Execution
import resid
from resid.analyses import graphs
from resid.dictionaries import Binding, Dictionary, Weights, check

bias = float(sys.argv[1])
config = resid.ModelConfig(architecture="llama_gqa", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8,
                           d_mlp=64, d_vocab=97, n_ctx=2048, norm_eps=1e-5, norm="rmsnorm", act="silu",
                           gated_mlp=True)
model = resid.Transformer(config, name="tiny-long")
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
def transcoder(l):
    W_enc = torch.randn(32, 256, generator=g) / 32**0.5
    weights = Weights(W_enc, torch.randn(256, 32, generator=g) / 16, torch.zeros(32), torch.full((256,), bias))
    return check(Dictionary(weights, binding=Binding(f"blocks.{l}.ln2.hook_normalized", f"blocks.{l}.hook_mlp_out"),
                            name=f"t{l}"), model)
transcoders = [transcoder(l) for l in range(2)]
ids = torch.randint(0, 97, (2048,), generator=g)
graph = graphs.attribute(model, ids, transcoders, max_feature_nodes=64, execution=Execution(batch_size=32))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"n_active": len(graph.active_features), "peak": peak, "n_features": graph.n_features}))
"""

BYTES_PER_FEATURE = 8192  # generous: the measured slope is about a fifth of this


@pytest.mark.slow  # two fresh processes building 2,048-position graphs (about 20 s)
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_memory_grows_linearly_with_the_active_features(tmp_path: Path) -> None:
    script = tmp_path / "long_graph.py"
    script.write_text(SCRIPT)

    def measure(bias: float) -> dict:
        done = subprocess.run([sys.executable, str(script), str(bias)], capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    sparse, dense = measure(-1.2), measure(-0.2)
    assert sparse["n_features"] == dense["n_features"] == 64
    extra = dense["n_active"] - sparse["n_active"]
    assert extra > 50_000, (sparse, dense)  # the dense set has many times more active features
    grown = dense["peak"] - sparse["peak"]
    assert grown < BYTES_PER_FEATURE * extra, (
        f"{grown / 2**20:.0f} MiB more for {extra} more active features: "
        f"{grown / extra:.0f} bytes per feature")
