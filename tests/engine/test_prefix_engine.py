"""The prefix cache inside the engine: shared prefixes computed once, and no KV block leaked
or freed twice after a soak of finished, aborted and preempted requests."""
import random

from freetoken import LLM, SamplingParams



def ids_for(n, seed):
    r = random.Random(seed)
    return [r.randrange(500) for _ in range(n)]


def _count_tokens(engine):
    seen = {"n": 0}
    run = engine.runner.run

    def counting(batch):
        seen["n"] += sum(n for _, n in batch)
        return run(batch)
    engine.runner.run = counting
    return seen


def test_concurrent_requests_compute_a_shared_prefix_once(tiny_dir):
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", max_num_batched_tokens=64)
    seen = _count_tokens(llm.engine)
    system = ids_for(300, seed=1)
    prompts = [system + ids_for(20, seed=10 + i) for i in range(3)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    # 300 shared + 3 x 20 own prompt tokens, + 2 decode steps each; not 3 x 320
    assert seen["n"] <= 300 + 3 * 20 + 3 * 2 + 3 * llm.engine.cfg.kv_block_size
    assert sorted(o.num_cached_tokens for o in outs) == [0, 300, 300]
    alone = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", prefix_cache=False)
    ref = alone.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_soak_of_finished_aborted_and_preempted_requests_leaks_no_block(tiny_dir):
    # about 40 blocks of 8 tokens: sessions of up to ~120 tokens, several at once, preempt
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", kv_block_size=8, max_num_batched_tokens=32,
              kv_cache_gib=41 * 8 * 512 / 2**30, max_num_seqs=4)
    engine, rng = llm.engine, random.Random(0)
    sessions = [ids_for(40, seed=s) for s in range(4)]
    preempted = []
    engine.on_preempt(preempted.append)
    n = 0
    for rnd in range(12):
        live = []
        for _ in range(rng.randint(2, 4)):
            s = rng.randrange(4)
            n += 1
            rid = f"r{n}"
            engine.add_request(rid, sessions[s] + ids_for(rng.randint(1, 20), seed=n),
                               SamplingParams(max_tokens=rng.randint(50, 100), temperature=0.0, ignore_eos=True))
            live.append(rid)
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            if steps == 3 and rng.random() < 0.5:
                engine.abort_request(rng.choice(live))
            engine.prefix.check()
        if rnd % 3 == 0:                               # sessions grow by their last answer
            s = rng.randrange(4)
            sessions[s] = sessions[s] + ids_for(10, seed=1000 + rnd)
    blocks = engine.blocks
    assert blocks.available == blocks.num_blocks - 1           # nothing held but by the tree
    assert sum(blocks.ref) == engine.prefix.num_nodes           # the tree's one reference each
    assert engine.prefix.stats.hit_tokens > 0 and preempted
    engine.prefix.reclaim(blocks.num_blocks)
    assert blocks.num_free == blocks.num_blocks - 1 and sorted(blocks.free) == list(range(1, blocks.num_blocks))
