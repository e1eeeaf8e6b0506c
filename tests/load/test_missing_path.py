"""A path that does not exist is reported as a missing path first, not as an unknown model or an offline Hub."""

import pytest

import resid
from resid.load import registry

MISSING = ["./no/such/folder", "x/model.gguf", "~/no-such-resid-model", "a/b/c", "w.safetensors"]


@pytest.mark.parametrize("name", MISSING)
def test_missing_path_says_so_first(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(resid.ResidError) as err:
        resid.load(name)
    message = str(err.value)
    assert message.startswith(f"The path {name!r} does not exist")
    assert "Hub could not be reached" not in message and "Unknown model" not in message


def test_missing_path_names_the_nearest_existing_folder(tmp_path):
    (tmp_path / "models").mkdir()
    with pytest.raises(resid.ResidError, match=f"nearest existing folder is {tmp_path / 'models'}"):
        resid.load(tmp_path / "models" / "gpt2-smal" / "weights")


def test_org_slash_name_is_still_a_hub_id_but_the_message_leads_with_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(resid.ResidError) as err:
        resid.load("no-such-org/no-such-model")
    message = str(err.value)
    assert message.startswith("Nothing exists at the local path 'no-such-org/no-such-model'")
    assert "could not be reached" in message  # and then the Hub was tried


@pytest.mark.parametrize("name, suggested", [("smolm2", "smollm2-135m"), ("Gemma-3-270", "gemma-3-270m"),
                                             ("all-MiniLM-L6", "all-minilm-l6-v2"), ("no-such-model", None)])
def test_a_misspelled_resid_name_gets_the_closest_one(name, suggested, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(resid.ResidError) as err:
        resid.load(name)
    message = str(err.value)
    assert message.startswith(f"Unknown model {name!r}.")
    assert (f"Did you mean {suggested!r}?" in message) if suggested else ("Did you mean" not in message)


@pytest.mark.parametrize("name", ["smollm2-135n", "gemma3-270m", "all-minilm-l6"])
def test_a_near_typo_of_a_resid_name_is_refused_without_asking_the_hub(name, tmp_path, monkeypatch):
    """Asking the Hub takes its time-out where the network hangs (a misspelled --model took 20 s): a bare name a
    letter or two from a resid name is refused at once, saying how to reach a Hub repository of that name."""
    def never(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "fetch", never)
    with pytest.raises(resid.ResidError, match=rf"Did you mean .*the Hugging Face Hub was not asked.*'owner/{name}'"):
        resid.load(name)
