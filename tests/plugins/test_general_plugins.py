"""General plugins: a package installed into a temporary site declares entry points
in ``minivllm.general_plugins``; one registers an out-of-tree architecture, which
then loads in tp=2 worker processes (each worker calls the plugin itself)."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import pytest

from minivllm import LLM
from minivllm.plugins import PLUGIN_GROUP, installed_plugins, load_general_plugins
from tests.executor import tp_helpers as h

TOY_ARCH = "ToyLlamaForCausalLM"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """A site directory holding the package ``toy_plugin`` and its dist-info, on
    sys.path here and on PYTHONPATH for the processes this module spawns."""
    site = tmp_path_factory.mktemp("site")
    pkg = site / "toy_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(f"""
        from minivllm.models.registry import ModelRegistry

        CALLS = []

        def register():
            CALLS.append("toy")
            ModelRegistry.register_model({TOY_ARCH!r}, "toy_plugin.model:{TOY_ARCH}")

        def broken():
            raise ImportError("toy_plugin needs a library that is not installed")
    """)
    )
    (pkg / "model.py").write_text(
        textwrap.dedent(f"""
        from minivllm.models.llama import LlamaForCausalLM

        class {TOY_ARCH}(LlamaForCausalLM):
            '''Llama under another name: stands for an out-of-tree model.'''
    """)
    )
    dist = site / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\ntoy = toy_plugin:register\nbroken = toy_plugin:broken\n")
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(site))
    mp.setenv("PYTHONPATH", f"{site}:{sys.path[0]}")
    yield site
    mp.undo()
    sys.modules.pop("toy_plugin", None)
    sys.modules.pop("toy_plugin.model", None)


@pytest.fixture(scope="module")
def toy_dir(llama_dir, tmp_path_factory):
    """The Llama test checkpoint, its config.json naming the out-of-tree architecture."""
    out = tmp_path_factory.mktemp("toy-llama")
    shutil.copytree(llama_dir, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = [TOY_ARCH]
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_entry_points_are_found(plugin_site):
    assert set(installed_plugins()) >= {"toy", "broken"}


def test_without_the_plugin_the_architecture_is_unknown(plugin_site, toy_dir):
    assert load_general_plugins([]) == []  # nothing allowed: nothing called
    with pytest.raises(ValueError, match=f"architecture '{TOY_ARCH}' is not supported"):
        LLM(model=str(toy_dir), overrides=["plugins=[]"], **h.LLM_KWARGS)


def test_a_plugin_is_called_once_per_process(plugin_site):
    import toy_plugin

    load_general_plugins(["toy"])
    load_general_plugins(["toy"])
    assert toy_plugin.CALLS == ["toy"]


def test_a_failing_plugin_is_a_clear_error_naming_it(plugin_site):
    with pytest.raises(RuntimeError, match=r"plugin 'broken' \(toy_plugin:broken.*ImportError: toy_plugin needs"):
        load_general_plugins(["toy", "broken"])


def test_an_allowed_name_that_is_not_installed_is_refused(plugin_site):
    with pytest.raises(ValueError, match=r"plugins=\['nope'\]: 'nope' not installed.*installed: broken, toy"):
        load_general_plugins(["nope"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_out_of_tree_architecture_loads_in_tp2_workers(plugin_site, toy_dir, llama_dir):
    llm = LLM(model=str(toy_dir), tensor_parallel_size=2, overrides=["plugins=[toy]"], **h.LLM_KWARGS)
    try:
        assert llm.apply_model(lambda model: type(model).__name__) == [TOY_ARCH, TOY_ARCH]
        import_calls = llm.collective_rpc(lambda worker: __import__("toy_plugin").CALLS)
        assert import_calls == [["toy"], ["toy"]]  # each worker called the plugin itself, once
        outputs = h.generate(llm)
    finally:
        llm.shutdown()
    reference = LLM(model=str(llama_dir), overrides=["plugins=[]"], **h.LLM_KWARGS)  # "broken" is installed too
    h.assert_same_outputs(h.generate(reference), outputs)
    reference.shutdown()
