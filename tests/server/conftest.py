"""Live servers on 127.0.0.1 (free ports) for the server tests: one over a scripted fake
engine (exact protocol checks), one over a real random-weight tiny model."""
from __future__ import annotations

import pytest

from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings

from live_server import MODEL_NAMES, LiveServer, make_fake


@pytest.fixture(scope="session")
def fake():
    """(engine, base_url) of a server over the scripted fake engine."""
    engine, svc, app = make_fake()
    srv = LiveServer(app)
    yield engine, srv.url, svc
    srv.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    try:
        from freetoken.tiny import make_tiny
    except ImportError as e:
        pytest.skip(f"the engine is not available: {e}")
    d = tmp_path_factory.mktemp("tiny-qwen3")
    return make_tiny("qwen3_moe", d, max_position_embeddings=65536)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    """(llm, base_url, service) of a server over a real random-weight tiny Qwen3-MoE."""
    from freetoken import LLM
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=65536, max_num_seqs=8,
              kv_cache_gib=0.5)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=8, max_waiting=32, max_tokens_cap=8)
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES))
    srv = LiveServer(app)
    yield llm, srv.url, svc
    srv.stop()
    llm.close()
