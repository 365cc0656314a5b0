"""Shared fixtures: the default model's folder and tokenizer, a tiny Llama with that tokenizer (per session), and a
local Ray with Serve's proxy on a free port (per test module)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import make_tiny_model

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from engine.loader import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def default_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, default_tokenizer):
    """A tiny Llama with the default model's tokenizer (so text prompts and stop strings work)."""
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"), default_tokenizer)


@pytest.fixture(scope="module")
def serve_port(request):
    """The port of this test module's own local Ray and Serve (deployments.launch.local_serve), shut down after the
    module; deploy apps there with deployments.launch.run_app. A module sizes the cluster with a SERVE_CLUSTER dict
    of local_serve's arguments (num_cpus, object_store_mb)."""
    from deployments.launch import local_serve

    with local_serve(**getattr(request.module, "SERVE_CLUSTER", {})) as port:
        yield port


@pytest.fixture(scope="module", params=["native", "torch"])
def kernels(request):
    """A module that uses this runs twice: on the CPU kernels (engine/csrc, where they build) and on the plain torch
    ops (DSPARK_KERNELS=torch), which are the ops a GPU runs: so CI covers the GPU's code path on CPU."""
    import engine.ops

    with pytest.MonkeyPatch.context() as mp:
        if request.param == "torch":
            mp.setenv("DSPARK_KERNELS", "torch")  # for engine processes the tests start, too
            mp.setattr(engine.ops, "_kernels", None)
            mp.setattr(engine.ops, "_loaded", True)
        yield request.param
