"""provenance.describe: the fields of the record, weight-file hashes (cached, equal to hashlib's), and a
record that survives JSON."""

import hashlib
import json
import os
from datetime import datetime, timezone

import pytest
import torch
from random_models import make_random_model

import resid
from resid.analyses.io import provenance


@pytest.fixture
def weights(tmp_path):
    files = [tmp_path / "model-00001.safetensors", tmp_path / "model-00002.safetensors"]
    files[0].write_bytes(os.urandom(5 << 20))  # larger than one 4 MiB read
    files[1].write_bytes(b"")
    return files


def test_sha256_equals_hashlib(weights):
    for path in weights:
        assert provenance.sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert provenance.sha256(str(weights[0])) == provenance.sha256(weights[0])  # str or Path


def test_sha256_is_computed_once_per_file_version(weights, monkeypatch):
    path = weights[0]
    first = provenance.sha256(path)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert provenance.sha256(path) == first and opened == []  # cached: the file is not read again
    # A rewritten file (new size and mtime) is hashed again, and the new hash is right.
    path.write_bytes(b"new weights")
    os.utime(path, ns=(1, 1))
    assert provenance.sha256(path) == hashlib.sha256(b"new weights").hexdigest()
    assert opened == [path]


def test_describe_fields(weights):
    base = make_random_model("llama_gqa")
    model = resid.Transformer(base.config, name="my-model", weight_files=tuple(weights))
    model.load_state_dict(base.state_dict())
    model = model.to(torch.bfloat16)
    before = datetime.now(timezone.utc).replace(microsecond=0)
    record = provenance.describe(model, "logit_lens.run", {"k": 5, "norm": "frozen"}, "a prompt",
                                 target=" Paris", baseline=" London")
    assert set(record) == {"analysis", "parameters", "prompts", "target", "baseline", "model", "weight_files",
                           "dtype", "device", "resid_version", "timestamp", "identity"}
    assert record["analysis"] == "logit_lens.run" and record["parameters"] == {"k": 5, "norm": "frozen"}
    assert record["prompts"] == ["a prompt"]  # one string is one prompt
    assert record["target"] == " Paris" and record["baseline"] == " London"
    assert record["model"] == "my-model" and record["dtype"] == "bfloat16" and record["device"] == "cpu"
    assert record["resid_version"] == resid.__version__
    assert record["identity"] == resid.identity(model).as_dict()
    assert record["weight_files"] == [
        {"path": os.fspath(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()} for path in weights
    ]
    stamp = datetime.fromisoformat(record["timestamp"])
    assert stamp.tzinfo is not None and before <= stamp <= datetime.now(timezone.utc)


def test_describe_prompts_and_no_weight_files():
    model = make_random_model("gpt2_like")
    assert provenance.describe(model, "x", {}, ("a", "b"))["prompts"] == ["a", "b"]
    record = provenance.describe(model, "x", {})
    assert record["prompts"] is None and record["target"] is None and record["baseline"] is None
    assert record["weight_files"] == [] and record["model"] == "random-gpt2_like" and record["dtype"] == "float32"


def test_describe_is_json_serializable(weights):
    model = resid.Transformer(make_random_model("neox_parallel").config, weight_files=tuple(weights))
    record = provenance.describe(model, "attribution.direct", {"level": "head", "pos": -1}, ["p1", "p2"], 42)
    assert json.loads(json.dumps(record)) == record  # plain JSON types only: nothing is stringified on the way
