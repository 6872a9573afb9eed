"""Tool-call and reasoning parsers, one file per model family, chosen by HF architecture."""
from .base import Parser
from .glm import GlmParser
from .deepseek import DeepSeekParser
from .harmony import HarmonyParser
from .minimax import MiniMaxParser
from .plain import PlainParser
from .qwen import QwenParser


def parser_for(architecture: str | None, chat_template: str | None = None) -> type[Parser]:
    """The checkpoint's chat template decides when it shows the markup; else the architecture."""
    t = chat_template or ""
    if "<|channel|>" in t:
        return HarmonyParser
    if "<minimax:tool_call>" in t:
        return MiniMaxParser
    if "<arg_key>" in t:
        return GlmParser
    if "<｜Assistant｜>" in t or "｜DSML｜" in t or "<｜tool▁calls▁begin｜>" in t:
        return DeepSeekParser
    if "<tool_call>" in t or "<think>" in t:
        return QwenParser
    if t:
        return PlainParser
    arch = (architecture or "").lower()
    if arch.startswith("qwen"):
        return QwenParser
    if arch.startswith("glm"):
        return GlmParser
    if arch.startswith("gptoss"):
        return HarmonyParser
    if arch.startswith("deepseek"):
        return DeepSeekParser
    if arch.startswith("minimax"):
        return MiniMaxParser
    return PlainParser


__all__ = ["Parser", "DeepSeekParser", "GlmParser", "HarmonyParser", "MiniMaxParser", "PlainParser", "QwenParser", "parser_for"]
