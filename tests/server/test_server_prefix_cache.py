"""An agent's growing history over HTTP: each protocol's cached-token field equals the prompt
tokens the engine did not run (counted at the model runner), and /metrics shows the hits."""
import time

import anthropic
import httpx
import openai


def _count_prefill(llm):
    """Wrap the runner: prompt tokens run through the model, summed (a speculative verify runs
    generated and drafted tokens several a step: only prompt positions are counted)."""
    runner = llm.engine.runner
    seen = {"tokens": 0}
    run = runner.run

    def counting(batch):
        seen["tokens"] += sum(max(0, min(s.num_computed + n, len(s.prompt_ids)) - s.num_computed) for s, n in batch)
        return run(batch)
    runner.run = counting
    return seen, lambda: setattr(runner, "run", run)


def test_cached_tokens_equal_what_the_engine_skipped(tiny):
    llm, url, _ = tiny
    seen, undo = _count_prefill(llm)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        history = [{"role": "system", "content": "You are a careful coding agent. " * 20},
                   {"role": "user", "content": "list the files"}]
        totals = []
        for turn in range(3):
            before = seen["tokens"]
            r = client.chat.completions.create(model="capture-model", messages=history, max_tokens=4,
                                               temperature=0)
            computed_prompt = seen["tokens"] - before
            cached = r.usage.prompt_tokens_details.cached_tokens
            assert cached == r.usage.prompt_tokens - computed_prompt
            totals.append(cached)
            history += [{"role": "assistant", "content": r.choices[0].message.content or "ok"},
                        {"role": "user", "content": f"now run test number {turn}"}]
        # turn 0 may share the template's first tokens with earlier tests' requests
        assert totals[0] < 20 and totals[1] > 100 and totals[2] > totals[1]

        before = seen["tokens"]
        a = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        msgs = [m for m in history if m["role"] != "system"]
        m = a.messages.create(model="claude-x", system=history[0]["content"], messages=msgs, max_tokens=3)
        ran = seen["tokens"] - before
        assert m.usage.input_tokens == ran            # Anthropic: input_tokens excludes cache reads
        assert m.usage.cache_read_input_tokens > 0

        body = {"model": "capture-model", "input": "list the files", "instructions": "be brief", "max_output_tokens": 3}
        first = httpx.post(url + "/v1/responses", json=body, timeout=60).json()
        again = httpx.post(url + "/v1/responses", json=body, timeout=60).json()
        assert first["usage"]["input_tokens_details"]["cached_tokens"] < 20
        assert again["usage"]["input_tokens_details"]["cached_tokens"] == again["usage"]["input_tokens"] - 1
    finally:
        undo()
    deadline = time.monotonic() + 5            # the engine thread refreshes its statistics every second
    while True:
        metrics = httpx.get(url + "/metrics", timeout=10).text
        hits = [ln for ln in metrics.splitlines() if ln.startswith("freetoken_engine_prefix_hit_tokens")]
        if (hits and float(hits[0].split()[-1]) > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert hits and float(hits[0].split()[-1]) > 0
    assert "freetoken_kv_blocks_in_use" in metrics
