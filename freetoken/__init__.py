"""FreeToken: serve large Mixture-of-Experts models on small GPUs or no GPU at all."""
from .llm import LLM, Completion
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "Completion"]
__version__ = "0.1.0"
