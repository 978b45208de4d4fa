"""Shared fixtures: small checkpoints built once per test session; engines on a background
event loop, servers over them and openai clients on those servers (tests/serve/harness.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


if not _cuda_visible():
    # Triton kernels run through its interpreter on a CPU machine; it reads this
    # variable when the kernels are first imported, so it is set before any test module.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests import checkpoints as ck  # noqa: E402
from tests.model_configs import llama_config, opt_config  # noqa: E402

# Test files that start Ray clusters: under pytest-xdist they run in one worker, one after another
# (a bare ``ray.init()`` joins the newest cluster on the machine, which may be another file's).
RAY_FILES = ("tests/ray/", "tests/executor/test_ray_executor.py")

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # the suite runs in one process without pytest-xdist
    pass
else:

    class FileScheduling(LoadScopeScheduling):
        """``make test``'s ``-n 2``: each test file goes whole to one worker, so a module's fixtures
        (engines, servers) are built once; the Ray files go together."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if path.startswith(RAY_FILES) else path

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist installed but off (-p no:xdist) has no such hook
    def pytest_xdist_make_scheduler(config, log):
        return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokenizer")
    ck.train_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory, tokenizer_dir):
    """``make_checkpoint(name, config)`` -> directory, built once per name."""
    built = {}

    def make(name: str, config, **kwargs):
        if name not in built:
            out = tmp_path_factory.mktemp(name)
            built[name] = ck.save_checkpoint(config, out, tokenizer_dir, **kwargs)
        return built[name]

    return make


@pytest.fixture(scope="session")
def opt_dir(make_checkpoint):
    return make_checkpoint("opt", opt_config())


@pytest.fixture(scope="session")
def llama_dir(make_checkpoint):
    return make_checkpoint("llama-gqa-untied", llama_config(tie=False))


@pytest.fixture(scope="session")
def llama_tied_dir(make_checkpoint):
    return make_checkpoint("llama-gqa-tied", llama_config(tie=True))


@pytest.fixture(scope="session")
def async_engine(llama_dir):
    """An AsyncLLM (its engine process) on a background event loop, shared by the serving tests."""
    from tests.serve.harness import EngineHarness, engine_config

    harness = EngineHarness(engine_config(llama_dir))
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def make_engine():
    """``make_engine(model, **keywords)`` -> an ``EngineHarness`` with an engine process of its own
    (``config_from_kwargs`` keywords; ``tests.serve.harness.ENGINE_KWARGS`` when none are given),
    closed with its servers when the module ends, or earlier by ``close()`` or a ``with`` block."""
    from tests.serve.harness import EngineHarness, engine_config

    made = []

    def make(model, **kwargs):
        made.append(EngineHarness(engine_config(model, **kwargs)))
        return made[-1]

    yield make
    for harness in reversed(made):
        harness.close()


@pytest.fixture(scope="module")
def start_server(async_engine):
    """``start_server(**serve_keys)`` -> a server over the shared engine (``async_engine``) with those
    ``serve.*`` keys, stopped when the module ends (or earlier, by ``stop()``)."""
    started = []

    def start(**serve):
        started.append(async_engine.start_server(**serve))
        return started[-1]

    yield start
    for handle in reversed(started):
        handle.stop()


@pytest.fixture(scope="module")
def openai_client():
    """``openai_client(server)`` -> the official ``openai.OpenAI`` client on ``server``'s /v1, with the
    server's API key, no retries and a 120 s timeout; closed when the module ends."""
    import openai

    clients = []

    def make(server):
        key = server.api_key or "none"
        clients.append(openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=120))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def client(server, openai_client):
    """The openai client on the test module's own ``server`` fixture."""
    return openai_client(server)
