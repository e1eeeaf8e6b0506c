"""The memory refusals read this process's limits too, not only the host's MemAvailable: under an address-space
limit (ulimit -v, RLIMIT_AS) or a cgroup's memory limit, a model that does not fit is refused by name before its
files are mapped (a mapping past ulimit -v was a MemoryError from mmap), and batch sizes shrink to what the limit
leaves."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import resid
from resid import batching
from resid.load.weights import check_fits


def test_a_cgroup_limit_below_memavailable_is_what_is_available(monkeypatch):
    monkeypatch.setattr(batching, "memory_limits", lambda: (None, 64 * 2**20))
    assert batching.available_bytes(torch.device("cpu")) <= 64 * 2**20
    with pytest.raises(resid.ResidError, match=r"needs 0\.1 GiB for its weights in float32, but the CPU has 0\.1 GiB "
                       r"available \(the least of the host's available memory and this process's limits"):
        check_fits(2**25, torch.float32, torch.device("cpu"), "the model in /models/m")
    check_fits(2**20, torch.float32, torch.device("cpu"), "the model in /models/m")  # 4 MiB fits


def test_an_address_space_limit_counts_the_mapped_files(monkeypatch):
    monkeypatch.setattr(batching, "memory_limits", lambda: (2**30, None))
    # the weights (0.5 GiB) fit, but mapping a 0.75 GiB file and copying them does not
    with pytest.raises(resid.ResidError, match=r"1\.2 GiB of address space, but this process's address-space limit "
                       r"\(ulimit -v, RLIMIT_AS\) leaves 1\.0 GiB"):
        check_fits(2**27, torch.float32, torch.device("cpu"), "m", address_space=3 * 2**28 + 2**29)
    check_fits(2**27, torch.float32, torch.device("cpu"), "m", address_space=2**29)


def test_the_cgroup_reading_takes_the_least_of_the_groups_and_counts_inactive_cache(monkeypatch, tmp_path):
    groups = []
    for name, limit, usage, cache in (("outer", 8 * 2**30, 5 * 2**30, 2**30), ("inner", "max", 2**30, 0),
                                      ("v1", 2**63 - 4096, 2**30, 0)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "limit").write_text(f"{limit}\n")
        (folder / "usage").write_text(f"{usage}\n")
        (folder / "memory.stat").write_text(f"anon 123\ninactive_file {cache}\nactive_file 7\n")
        groups.append((str(folder), "limit", "usage", "inactive_file"))
    monkeypatch.setattr(batching, "_cgroup_folders", lambda: groups)
    assert batching._cgroup_left() == 4 * 2**30  # outer: 8 - 5 + 1 GiB; "max" and v1's 2**63 are no limit
    monkeypatch.setattr(batching, "_cgroup_folders", lambda: groups[1:])
    assert batching._cgroup_left() is None


LOAD_UNDER_LIMIT = """
import json, resource, sys
from pathlib import Path
import resid
from resid.batching import memory_limits
folder = Path(sys.argv[1])
vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize:')).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**29, resource.RLIM_INFINITY))  # 512 MiB more than now
left = memory_limits()[0]
assert 2**29 - 2**26 < left <= 2**29, left
try:
    resid.load(folder)
except resid.ResidError as error:
    print(error)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists() or sys.platform != "linux", reason="Linux's RLIMIT_AS")
def test_under_ulimit_v_a_model_whose_files_exceed_it_is_refused_before_mapping(tmp_path):
    """A real limit in a subprocess: a 1 GiB weight file (sparse: no disk) under 512 MiB of address space."""
    folder = tmp_path / "model"
    folder.mkdir()
    config = dict(model_type="llama", hidden_size=8192, num_hidden_layers=1, num_attention_heads=64,
                  num_key_value_heads=64, intermediate_size=8192, vocab_size=1024, max_position_embeddings=64,
                  rms_norm_eps=1e-6)
    (folder / "config.json").write_text(json.dumps(config))
    n = 2**28  # float32 values: 1 GiB
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [n // 8192, 8192],
                                                       "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(len(header).to_bytes(8, "little") + header)
        handle.truncate(8 + len(header) + 4 * n)
    out = subprocess.run([sys.executable, "-c", LOAD_UNDER_LIMIT, str(folder)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1.0 GiB of address space, but this process's address-space limit (ulimit -v, RLIMIT_AS) leaves 0.5 GiB" \
        in out.stdout, out.stdout + out.stderr[-3000:]
