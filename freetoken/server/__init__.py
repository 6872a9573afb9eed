"""HTTP serving: OpenAI and Anthropic adapters over one neutral generation layer."""
