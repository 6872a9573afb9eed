"""The server talks to engines through `EngineClient` only: the real engine and the scripted
fake both satisfy it."""
from fake_engine import FakeEngine

from freetoken import LLM
from freetoken.engine.client import EngineClient


def test_fake_and_real_engines_are_engine_clients(tiny_dir):
    assert isinstance(FakeEngine(), EngineClient)
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32")
    try:
        assert isinstance(llm.engine, EngineClient)
    finally:
        llm.close()
