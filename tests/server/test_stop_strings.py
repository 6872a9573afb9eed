"""Issue 25.3: stop lists are bounded (count, length: 400) and matched by one automaton;
the automaton finds exactly what a naive find-every-string-each-step reference finds."""
import httpx
from hypothesis import given, settings, strategies as st

from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.server.prepare import MAX_STOP_CHARS, MAX_STOP_STRINGS

VOCAB = ["a", "b", "ab", "ba", "c", "abc", " ", "é", "\n"]


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(VOCAB[i] for i in ids)


def naive(ids, stop):
    """The reference: after each token, text.find of every stop string; cut at the earliest."""
    text, emitted, out = "", 0, []
    hold = max((len(s) for s in stop), default=1) - 1
    for t in ids:
        before = len(text)
        text += VOCAB[t]
        hits = [(text.find(s, max(0, before - hold)), s) for s in stop]
        hits = [h for h in hits if h[0] >= 0]
        if hits:
            i, s = min(hits)
            return text[:i], s
    return text, None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(range(len(VOCAB))), max_size=60),
       st.lists(st.text(alphabet="abcé \n", min_size=1, max_size=6), max_size=8))
def test_automaton_matches_the_naive_reference(ids, stop):
    d = IncrementalDetokenizer(CharTokenizer(), [], stop)
    shown, hit = [], False
    for t in ids:
        hit = d.add(t)
        shown.append(d.take(final=hit))
        if hit:
            break
    if not hit:
        shown.append(d.take(final=True))
    text, matched = naive(ids, stop)
    assert "".join(shown) == text
    assert d.matched_stop == matched
    # no part of a stop string was shown before the sequence stopped
    if matched:
        assert matched not in "".join(shown)


def test_caps_answer_400(fake):
    _, url, _ = fake
    base = {"model": "capture-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for stop in (["s%d" % i for i in range(MAX_STOP_STRINGS + 1)], ["x" * (MAX_STOP_CHARS + 1)]):
        r = httpx.post(url + "/v1/chat/completions", json={**base, "stop": stop}, timeout=30)
        assert r.status_code == 400 and "stop" in r.json()["error"]["message"], r.text[:200]
        r = httpx.post(url + "/v1/messages", json={**base, "stop_sequences": stop}, timeout=30)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text[:200]
    ok = ["s%d" % i for i in range(MAX_STOP_STRINGS)]
    assert httpx.post(url + "/v1/chat/completions", json={**base, "stop": ok}, timeout=30).status_code == 200
