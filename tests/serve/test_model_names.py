"""Served model names: a list from the command line, ``models.retrieve`` with the
official openai client, and the demo model's short id."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm.config.store import build_config, compose
from minivllm.config.task import served_model_names
from minivllm.tokenizer import DEMO_TOKENIZER


@pytest.fixture(scope="module")
def server(start_server):
    names = build_config(["serve.served_model_name=[tiny,alias]"]).serve.served_model_name
    return start_server(served_model_name=names)


def test_a_list_of_names_from_the_command_line_is_served_under_every_name(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny", "alias"]
    card = client.models.retrieve("alias")
    assert card.id == "alias" and card.model_extra["max_model_len"] == server.harness.cfg.max_model_len
    res = client.completions.create(model="alias", prompt="def f(x):", max_tokens=2)
    assert res.model == "tiny" and res.choices[0].finish_reason == "length"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.status_code == 404 and err.value.body["param"] == "model"
    assert "no-such-model" in err.value.body["message"]


def test_retrieve_accepts_a_name_with_a_slash(start_server):
    handle = start_server(served_model_name="org/tiny")
    res = httpx.get(f"{handle.base_url}/v1/models/org/tiny", timeout=30)
    assert res.status_code == 200 and res.json()["id"] == "org/tiny"


@pytest.mark.parametrize("bad", ["[]", "[a,7]", "'a,,b'"])
def test_bad_served_model_names_are_refused_naming_the_key(bad):
    with pytest.raises(Exception, match="serve.served_model_name"):
        build_config([f"serve.served_model_name={bad}"])


def test_the_demo_model_is_called_demo():
    cfg = compose([])
    assert served_model_names(cfg.serve.served_model_name, cfg.model.path) == ["demo"]
    assert served_model_names(None, str(DEMO_TOKENIZER)) == ["demo"]
    assert served_model_names(None, "/models/llama") == ["/models/llama"]
    assert served_model_names("a,b", "/x") == ["a", "b"]
