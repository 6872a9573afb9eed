"""The prefix router's table and rule (server/replicas/table.py) against brute force: a
replica's match is the longest block-aligned prefix of the prompt that some prompt sent to
it shares (minus what was dropped), and the choice follows the documented rule."""
from hypothesis import given, settings, strategies as st

from freetoken.server.replicas.table import PrefixTable, Sessions, block_hashes, choose

BS = 4
REPLICAS = ["a", "b", "c"]

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=24)   # a tiny alphabet: many shared prefixes
ops = st.lists(st.one_of(st.tuples(st.just("send"), st.sampled_from(REPLICAS), tokens),
                         st.tuples(st.just("drop"), st.sampled_from(REPLICAS), st.just([]))),
               max_size=30)


def brute_match(sent: list[list[int]], prompt: list[int]) -> int:
    """Longest k such that prompt[:k*BS] == s[:k*BS] for some sent s of at least that length."""
    best = 0
    for s in sent:
        k = 0
        while (k + 1) * BS <= min(len(s), len(prompt)) and s[:(k + 1) * BS] == prompt[:(k + 1) * BS]:
            k += 1
        best = max(best, k)
    return best


@settings(max_examples=300, deadline=None)
@given(ops, tokens)
def test_longest_prefix_matches_brute_force(history, prompt):
    table, sent = PrefixTable(), {r: [] for r in REPLICAS}
    for r in REPLICAS:
        table.add_replica(r)
    for op, r, toks in history:
        if op == "send":
            table.insert(r, block_hashes(toks, BS))
            sent[r].append(toks)
        else:
            table.drop(r)
            sent[r] = []
            table.add_replica(r)           # a restarted replica starts empty
    key = block_hashes(prompt, BS)
    assert table.matches(key) == {r: brute_match(sent[r], prompt) for r in REPLICAS}


@settings(max_examples=200, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=10), st.integers(0, 40), tokens)
def test_evictions_only_shrink_and_count(prompts, n_evicted, prompt):
    table = PrefixTable()
    table.add_replica("a")
    for p in prompts:
        table.insert("a", block_hashes(p, BS))
    before, m0 = table.size("a"), table.match("a", block_hashes(prompt, BS))
    table.evicted("a", 0)                  # first report: the baseline
    table.evicted("a", n_evicted)
    assert table.size("a") == max(0, before - n_evicted)
    assert table.match("a", block_hashes(prompt, BS)) <= m0
    # the newest prompt's root end goes last: with one block left it is the newest's first
    if table.size("a") == 1 and block_hashes(prompts[-1], BS):
        assert table.match("a", block_hashes(prompts[-1], BS)) == 1


def test_capacity_keeps_the_newest_prompt():
    table = PrefixTable()
    table.add_replica("a")
    table.set_capacity("a", 3)
    old, new = list(range(12)), [9] * 12
    table.insert("a", block_hashes(old, BS))
    table.insert("a", block_hashes(new, BS))
    assert table.match("a", block_hashes(new, BS)) == 3 and table.match("a", block_hashes(old, BS)) == 0


def brute_choose(matches, loads, session, bound, held):
    """The rule written out as a ranking: the session's replica if nobody holds more of the
    prompt; else the best (match, -load, id) unless its load exceeds the minimum by more
    than the bound, then the best (-load, match, id); equal loads: fewer blocks held first."""
    live = sorted(loads)
    match = {r: matches.get(r, 0) for r in live}
    if session in loads and all(match[r] <= match[session] for r in live):
        return session
    size = {r: held.get(r, 0) for r in live}
    by_prefix = sorted(live, key=lambda r: (-match[r], loads[r], size[r], r))[0]
    if not any(match.values()):
        by_prefix = sorted(live, key=lambda r: (loads[r], size[r], r))[0]
    by_load = sorted(live, key=lambda r: (loads[r], -match[r], size[r], r))[0]
    return by_load if loads[by_prefix] > min(loads.values()) + bound else by_prefix


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(REPLICAS), st.integers(0, 5), min_size=1),
       st.dictionaries(st.sampled_from(REPLICAS), st.integers(0, 6)),
       st.one_of(st.none(), st.sampled_from(REPLICAS)), st.integers(0, 4),
       st.dictionaries(st.sampled_from(REPLICAS), st.integers(0, 3)))
def test_choice_follows_the_rule(loads, matches, session, bound, held):
    c = choose(matches, loads, session, bound, held)
    assert c.replica == brute_choose(matches, loads, session, bound, held)
    assert c.replica in loads
    if c.reason == "prefix":
        assert c.matched_blocks == max(matches.get(r, 0) for r in loads)


def test_dead_replica_sessions_are_rerouted():
    s = Sessions()
    s.set("s1", "a")
    s.set("s2", "b")
    assert s.drop_replica("a") == 1 and s.get("s1") is None and s.get("s2") == "b"
    assert choose({}, {"b": 3, "c": 0}, s.get("s1"), 8).replica == "c"     # least loaded
    assert choose({}, {"b": 3, "c": 0}, s.get("s2"), 8).replica == "b"     # sticks
    assert choose({}, {"b": 9, "c": 0}, s.get("s2"), 8).replica == "b"     # sticks past the bound too
    assert choose({}, {"b": 9, "c": 0}, None, 8).replica == "c"            # no session: over the bound
    # a new session whose only match is the shared system prompt goes where the load is
    assert choose({"b": 5, "c": 0}, {"b": 3, "c": 0}, None, 2).replica == "c"
    assert choose({"b": 5, "c": 0}, {"b": 2, "c": 0}, None, 2).replica == "b"
    # a session moved elsewhere (its replica restarted) follows its longer prefix
    assert choose({"b": 1, "c": 7}, {"b": 0, "c": 0}, "b", 2).replica == "c"


def test_a_conversation_keeps_its_session_as_it_grows():
    import json

    from freetoken.server.replicas.route_key import session_of
    first = [{"role": "system", "content": "policy"}, {"role": "user", "content": "book a flight"}]
    later = first + [{"role": "assistant", "content": "where to?"}, {"role": "user", "content": "Paris"}]
    other = [first[0], {"role": "user", "content": "cancel my booking"}]

    def of(body, headers=None):
        return session_of(headers or {}, json.dumps(body).encode())
    assert of({"messages": first}) == of({"messages": later}) != of({"messages": other})
    assert of({"system": "policy", "messages": first[1:]}) == of({"system": "policy", "messages": later[1:]})
    assert of({"instructions": "i", "input": "hello"}) == of({"instructions": "i", "input": [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]})
    assert of({"messages": later, "user": "u1"}) == "u1" == of({"messages": other}, {"x-session-id": "u1"})
    assert of({"prompt": "text"}) is None and of({"messages": [first[0]]}) is None
