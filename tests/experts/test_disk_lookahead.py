"""Router lookahead and direct reads change what is read and when, never the numbers: with
lookahead router / history / off, O_DIRECT on / off and any number of reads in flight, the
disk tier's prompt logits and greedy tokens are the resident pool's bit for bit; the router
guess is what layer l+1's own router picks for layer l's input (checked against the model's
routers called directly); lookahead never reads an expert into a slot where it already is
(or is already being read), and its guesses are scored in the stats."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import LLM
from freetoken.experts.disk.lookahead import model_routes
from tiered_helpers import DISK_GREEDY, DISK_PROMPT, disk_outputs, resident_ftw


@pytest.fixture(scope="module")
def ftw(tiny_dir, tmp_path_factory):
    return resident_ftw(tiny_dir, tmp_path_factory.mktemp("la"))


OPTS = [dict(expert_lookahead="router", disk_direct_io="on", disk_io_threads=1),
        dict(expert_lookahead="auto", disk_direct_io="on", disk_io_threads=4),
        dict(expert_lookahead="router", disk_direct_io="off", disk_io_threads=16),
        dict(expert_lookahead="history", disk_direct_io="on", disk_io_threads=3),
        dict(expert_lookahead="off", disk_direct_io="auto", disk_io_threads=2)]


@pytest.mark.parametrize("opts", OPTS, ids=[f"{o['expert_lookahead']}-{o['disk_direct_io']}-{o['disk_io_threads']}"
                                            for o in OPTS])
@pytest.mark.parametrize("slots", [4, 12])
def test_tokens_identical_whatever_lookahead_direct_io_queue_depth(ftw, opts, slots):
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=slots, prefix_cache=False, **opts)
    try:
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits)
        assert g_tokens == tokens
        st = llm.expert_stats()
        la, io = st["lookahead"], st["disk"]["io"]
        assert la["source"] == opts["expert_lookahead"] or (opts["expert_lookahead"] == "auto"
                                                            and la["source"] in ("router", "history"))
        assert io["mode"] == ("buffered" if opts["disk_direct_io"] == "off" else "direct")
        assert llm.engine.model.experts.cache._io.threads == opts["disk_io_threads"]
        if opts["expert_lookahead"] != "off":
            assert la["guessed"] > 0 and la["needed"] > 0 and 0 <= la["right"] <= min(la["guessed"], la["needed"])
    finally:
        llm.close()


def test_router_guess_is_the_next_layers_router_on_this_input(ftw):
    """The guess for layer l+1 = the experts layer l+1's router picks for layer l's MoE input,
    best rank first, each once (the model's own SparseMoE.route, called here directly)."""
    path, _ = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False, expert_lookahead="router")
    try:
        experts = llm.engine.model.experts
        routes = model_routes(llm.engine.model)
        assert sorted(routes) == list(range(experts.layout.num_layers))
        x = torch.randn(3, llm.engine.model.hidden)
        for layer in range(experts.layout.num_layers - 1):
            got = experts.router.guess(layer, x)
            ids, w = routes[layer + 1](x)
            assert sorted(got.tolist()) == sorted(set(ids.flatten().tolist()))
            firsts = set(ids[:, 0].tolist())       # tokens may share a first choice: it leads once
            assert set(got[:len(firsts)].tolist()) == firsts                 # every token's first choice leads
            one = experts.router.guess(layer, x[:1])                      # one token (decode): its ranks in order
            assert one.tolist() == routes[layer + 1](x[:1])[0][0].tolist()
            moe = routes[layer + 1].__self__                              # (on the decode thread alone)
            assert moe.kernel_top_ids() and one is not experts.router.guess(layer, x[:1])
            logits = x[:1].double() @ moe.router.dequantized().double().T  # float64: the top-k's set
            assert set(one.tolist()) == set(torch.topk(logits[0], len(one)).indices.tolist())
        assert experts.router.guess(experts.layout.num_layers - 1, x) is None
    finally:
        llm.close()


@pytest.mark.parametrize("mode", ["auto", "router"])
def test_each_guesser_guesses_every_call_only_while_it_is_not_the_worse_guess(ftw, mode):
    """In "auto", while the history predictor has guessed better (F1), the router guesses one
    decode layer call in GUESS_SAMPLE (its score kept current), and every call once it is
    no worse; `_due` answers the same way round for the history while the router leads (the
    engine asks it for the router only: the history guesses every call); "router" mode guesses
    every call. Tokens stay the resident run's either way."""
    from freetoken.experts.disk.backend import GUESS_SAMPLE
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False, expert_lookahead=mode)
    experts = llm.engine.model.experts
    guess = experts.router.guess
    calls = []
    experts.router.guess = lambda layer, x: (calls.append(layer), guess(layer, x))[1]
    try:
        hist, router = experts.scores["history"], experts.scores["router"]
        hist.guessed = hist.right = hist.needed = 10**6          # the history: right every time
        router.guessed, router.right, router.needed = 10**6, 0, 10**6
        due = [experts._due("router") for _ in range(4 * GUESS_SAMPLE)]
        assert sum(due) == (4 if mode == "auto" else 4 * GUESS_SAMPLE)
        assert all(experts._due("history") for _ in range(GUESS_SAMPLE))     # the leader: every call
        router.right = 10**6                                     # now as good: every call
        assert all(experts._due("router") for _ in range(GUESS_SAMPLE))
        hist.right = 0                                           # the router leads: the history sampled
        if mode == "auto":
            assert sum(experts._due("history") for _ in range(4 * GUESS_SAMPLE)) == 4
        router.right = 0
        assert disk_outputs(llm)[1] == tokens and (calls or mode == "auto")
    finally:
        experts.router.guess = guess
        llm.close()


def test_lookahead_never_reads_an_expert_twice_into_the_same_slot(ftw):
    """Every read started (misses and lookahead reads alike) is of an expert not resident and
    not in flight, into a slot that then holds it: reading it again into that slot would be
    a wasted read (or two writers on one slot)."""
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=6, prefix_cache=False, expert_lookahead="router")
    cache = llm.engine.model.experts.cache
    start = cache._start
    seen = []

    def checked(flats, slots, *priority):
        t = cache.table
        assert (t.slot_of[flats] < 0).all(), "an expert already resident or in flight was read again"
        assert len(set(slots.tolist())) == len(slots) and len(set(flats.tolist())) == len(flats)
        seen.append((flats.copy(), slots.copy()))
        return start(flats, slots, *priority)

    cache._start = checked
    try:
        assert disk_outputs(llm)[1] == tokens
        cache.drain()       # the last layer reads the next token's first experts ahead: let them land
        st = llm.expert_stats()
        assert st["lookahead"]["prefetched"] > 0 and seen
        # every read started landed, but the wrong guesses cancelled before they began (read_queue.py)
        assert st["host_cache"]["reads"] == sum(len(f) for f, _ in seen) - st["host_cache"]["cancelled"]
    finally:
        cache._start = start
        llm.close()


def test_stats_in_memory_summary(ftw):
    """/v1/memory's tiers (tier_summary) carry the lookahead scores and the read mode."""
    from freetoken.experts.measure.stats import tier_summary
    from freetoken.server.operations.metrics import flatten
    path, _ = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=6, prefix_cache=False)
    try:
        disk_outputs(llm)
        st = llm.expert_stats()
        summ = tier_summary(st)
        assert summ["lookahead"]["source"] in ("router", "history") and "wasted_per_useful" in summ["lookahead"]
        assert summ["disk"]["io"]["mode"] in ("direct", "buffered")
        names = {n for n, _ in flatten(st)}
        assert {"lookahead_precision", "lookahead_misses_covered", "lookahead_wasted_per_useful"} <= names
    finally:
        llm.close()


def test_bad_lookahead_is_refused(ftw):
    path, _ = ftw
    with pytest.raises((ValueError, Exception), match="lookahead"):
        LLM(str(path), dtype="float32", host_cache_slots=4, expert_lookahead="psychic")


def test_guess_ordering_is_rank_major():
    from freetoken.experts.disk.lookahead import RouterLookahead
    ids = torch.tensor([[3, 1], [5, 3], [3, 7]])
    la = RouterLookahead({1: lambda x: (ids, None)})
    assert la.guess(0, torch.zeros(3, 4)).tolist() == [3, 5, 1, 7]
    assert np.array_equal(la.guess(1, torch.zeros(1, 4)) is None, True)


def test_runners_up_are_the_next_ranks_of_the_next_layers_router(ftw):
    """`runners_up(l, n)`: the n experts layer l+1's router ranks right after its top-k for the
    last one-token guess, best first (float64 logits here as the reference); none after a guess
    of several rows (a verify's), none for another layer, and the several-row guess on the
    decode thread alone is the router's own choice for every row."""
    path, _ = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False, expert_lookahead="router")
    try:
        experts = llm.engine.model.experts
        routes = model_routes(llm.engine.model)
        torch.manual_seed(3)
        for layer in range(experts.layout.num_layers - 1):
            x = torch.randn(1, llm.engine.model.hidden)
            top = experts.router.guess(layer, x)
            moe = routes[layer + 1].__self__
            logits = (x.double() @ moe.router.dequantized().double().T)[0]
            n = min(3, experts.E - len(top))
            runners = experts.router.runners_up(layer, n)
            assert len(runners) == n and not set(runners.tolist()) & set(top.tolist())
            assert set(top.tolist()) | set(runners.tolist()) == set(torch.topk(logits, len(top) + n).indices.tolist())
            assert (np.diff(logits[torch.from_numpy(runners)].numpy()) <= 0).all()      # best first
            assert experts.router.runners_up(layer + 1, n).size == 0
            rows = torch.randn(4, llm.engine.model.hidden)
            got = experts.router.guess(layer, rows)
            ids, _ = routes[layer + 1](rows)
            assert sorted(got.tolist()) == sorted(set(ids.flatten().tolist()))
            assert experts.router.runners_up(layer, n).size == 0
    finally:
        llm.close()


@pytest.mark.parametrize("extra", [1, 4])
def test_tokens_identical_with_the_runners_up_read(ftw, extra, monkeypatch):
    """Reading the router's runners-up too (backend.EXTRA_GUESSES) moves only which bytes are
    read: the resident pool's logits and tokens; the runners-up are read ahead."""
    from freetoken.experts.disk import backend
    monkeypatch.setattr(backend, "EXTRA_GUESSES", extra)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=6, prefix_cache=False, expert_lookahead="router",
              speculative="off")      # (one-token decode steps: a verify's guess has no runners-up)
    try:
        experts = llm.engine.model.experts
        wide = []
        runners_up = experts.router.runners_up
        experts.router.runners_up = lambda layer, n: wide.append(runners_up(layer, n)) or wide[-1]
        assert torch.equal(llm.score(DISK_PROMPT), logits)
        assert llm.generate([DISK_PROMPT], DISK_GREEDY)[0].token_ids == tokens[0]     # (one row a step)
        k = model_routes(llm.engine.model)[1].__self__.top_k
        assert any(len(w) == min(extra, experts.E - k) for w in wide)
    finally:
        llm.close()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_tokens_identical_whatever_read_ahead_depth(ftw, depth, monkeypatch):
    """Reading 1, 2 or 3 layers ahead (lookahead.DEPTH, the chained history guesses) moves only
    when bytes arrive: the resident pool's logits and tokens."""
    from freetoken.experts.disk import backend
    monkeypatch.setattr(backend, "DEPTH", depth)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=5, prefix_cache=False, expert_lookahead="history")
    try:
        assert llm.engine.model.experts.depth == depth
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        assert llm.expert_stats()["lookahead"]["prefetched"] > 0
    finally:
        llm.close()


def test_last_layer_reads_the_next_tokens_first_experts_ahead(ftw):
    """In decode, layer 0's experts are read ahead only by the last layer's guess of the next
    token's first experts (no speculative hints here): some are, and the predictor learnt that step."""
    path, (_, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=6, prefix_cache=False, expert_lookahead="history",
              speculative="off")
    experts = llm.engine.model.experts
    cache, seen = experts.cache, []
    prefetch = cache.prefetch

    def spy(ids, *a, **k):
        if experts.phase == "decode":
            seen.append(np.asarray(ids).copy())
        return prefetch(ids, *a, **k)

    cache.prefetch = spy
    try:
        assert [c.token_ids for c in llm.generate([DISK_PROMPT], DISK_GREEDY)] == tokens[:1]
        assert experts.predictor.pairs[-1].any()
        assert any((ids < experts.E).any() for ids in seen)
    finally:
        cache.prefetch = prefetch
        llm.close()


def test_a_cache_that_holds_the_pool_keeps_slots_in_expert_order(ftw):
    """With room for the whole pool, expert f is read into slot f: the slots of any call ascend
    with its experts, so a call at full hits is one kernel call (as on the resident pool), and
    the numbers are still the resident pool's."""
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=10**9, prefix_cache=False)
    ex = llm.engine.model.experts
    try:
        assert disk_outputs(llm)[1] == tokens
        ex.cache.drain()
        t = ex.cache.table
        res = np.flatnonzero(t.slot_of >= 0)
        assert len(res) and (t.slot_of[res] == res).all()
        k0, c0 = ex.kernel_calls, llm.expert_stats()["total"]["calls"]
        g_logits, g_tokens = disk_outputs(llm)                   # the same routing again: every call hits
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        assert ex.kernel_calls - k0 == llm.expert_stats()["total"]["calls"] - c0
    finally:
        llm.close()


@pytest.mark.parametrize("read", ["routed", "layer"])
def test_a_prompt_reads_what_the_next_layers_router_picks_for_it(ftw, read, monkeypatch):
    """A prompt chunk reads of layer l+1, while layer l runs, the experts layer l+1's own router
    picks for any of its tokens on layer l's MoE input (`PREFILL_READ` "routed"; checked against
    the model's routers called directly), or the whole of layer l+1 ("layer"); the prompt's
    logits and greedy tokens are the resident pool's bit for bit either way."""
    import freetoken.experts.disk.backend as backend
    monkeypatch.setattr(backend, "PREFILL_READ", read)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=16, prefix_cache=False, expert_lookahead="router")
    try:
        experts = llm.engine.model.experts
        E, routes, reads = experts.E, model_routes(llm.engine.model), []
        forward, prefetch = experts.forward, experts.cache.prefetch

        def spy_forward(layer, x, ids, w):
            if experts.phase == "prefill":
                reads.append((layer, x.clone(), None))
            return forward(layer, x, ids, w)

        def spy_prefetch(flats, budgeted=True):
            if experts.phase == "prefill" and reads:
                reads[-1] = (*reads[-1][:2], np.asarray(flats).copy())
            return prefetch(flats, budgeted)
        monkeypatch.setattr(experts, "forward", spy_forward)
        monkeypatch.setattr(experts.cache, "prefetch", spy_prefetch)
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        checked = 0
        for layer, x, flats in reads:
            if layer + 1 >= experts.layout.num_layers:
                assert flats is None
                continue
            ids, _ = routes[layer + 1](x)
            want = sorted(set(ids.flatten().tolist())) if read == "routed" else list(range(E))
            assert sorted((flats - (layer + 1) * E).tolist()) == want
            checked += 1
        assert checked >= 2            # (the scored prompt's and the generated prompts' first layer)
        la = llm.expert_stats()["lookahead"]
        assert (la["prefill_guessed"] > 0) == (read == "routed")
        assert 0 <= la["prefill_right"] <= min(la["prefill_guessed"], la["prefill_needed"])
    finally:
        llm.close()


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("slots", [4, 9])
def test_tokens_identical_whenever_a_call_starts_its_read_ahead(ftw, first, slots, monkeypatch):
    """A layer call starts reading the next layer's guesses as soon as it holds its own experts
    (`READ_AHEAD_FIRST`), or after it has run: the reads land while it computes either way, the
    numbers are the resident pool's, and the guesses are read and scored."""
    import freetoken.experts.disk.backend as backend
    monkeypatch.setattr(backend, "READ_AHEAD_FIRST", first)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=slots, prefix_cache=False, expert_lookahead="router",
              disk_io_threads=2)
    try:
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        la = llm.expert_stats()["lookahead"]
        assert la["guessed"] > 0 and la["prefetched"] > 0
    finally:
        llm.close()
