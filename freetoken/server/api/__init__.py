"""The HTTP API adapters (OpenAI, OpenAI Responses, Anthropic, tokenize) and their SSE framing, over the neutral generation layer."""
