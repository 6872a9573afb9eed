"""Speculative decoding (issue 34): drafters propose tokens a sequence is likely to emit next,
the engine verifies them in one forward of k+1 positions, and a price decides k per step.

- drafters.py: the Drafter interface and the drafts it returns
- suffix.py:   a suffix index over every session's tokens (shared, bounded, incremental)
- ngram.py:    prompt n-gram lookup (llama.cpp's prompt lookup)
- acceptance.py: online acceptance statistics per drafter and confidence bucket
- price.py:    verify cost (dense + attention per position + the union of routed experts)
- routing.py:  the routing observer that measures a verify's union of experts
- verify.py:   the exact acceptance rule (greedy identity, speculative sampling)
- draft_model.py: a separate draft model with the same tokenizer (its own paged KV, rolled back)
- lookahead.py: drafts as an expert lookahead (the verify's experts prefetched ahead of their layer)
- speculator.py: ties them together for the engine
- replay.py:   recorded agent sessions as turns (the bench's forced outputs, the suffix reference test)
"""
