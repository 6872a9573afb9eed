"""The next-layer predictor against counts recomputed from the whole observation history."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import kernels
from freetoken.experts.memory.next_layer import NextLayerPredictor

# every way the one-hop predictor counts and guesses: numpy (None) and each C build (kernels/c/next_layer.c)
BUILDS = [None, *kernels.variants_here()]

L, E = 4, 5
calls = st.lists(st.tuples(st.integers(0, L - 1), st.sets(st.integers(0, E - 1), min_size=1, max_size=E)),
                 max_size=40)


def reference(history, layer, experts, threshold):
    """P(b | experts at layer) from all consecutive (layer, layer+1) pairs of calls so far."""
    pairs, seen = {}, {}
    for (l0, a_set), (l1, b_set) in zip(history, history[1:]):
        if l0 == layer and l1 == layer + 1:
            for a in a_set:
                seen[a] = seen.get(a, 0) + 1
                for b in b_set:
                    pairs[a, b] = pairs.get((a, b), 0) + 1
    if layer + 1 >= L:
        return [0.0] * E, []
    p = [sum(pairs.get((a, b), 0) / max(seen.get(a, 0), 1) for a in experts) / len(experts) for b in range(E)]
    return p, sorted((b for b in range(E) if p[b] >= threshold - 1e-9), key=lambda b: (-p[b], b))


@pytest.mark.parametrize("build", BUILDS)
@settings(max_examples=150, deadline=None)
@given(ops=calls, threshold=st.sampled_from([0.1, 0.2, 0.5, 1.0]))
def test_predictions_match_counts_from_the_history(build, ops, threshold):
    pred = NextLayerPredictor(L, E, threshold)
    pred.lib = kernels.load(build) if build else None
    history = []
    for layer, experts in ops:
        ids = np.array(sorted(experts), np.int64)
        pred.observe(layer, ids)
        history.append((layer, sorted(experts)))
        p, guess = reference(history, layer, sorted(experts), threshold)
        assert np.allclose(pred.probabilities(layer, ids), p)
        assert pred.predict(layer, ids).tolist() == guess
        assert (pred.probabilities(layer, ids) <= 1 + 1e-12).all()


@pytest.mark.parametrize("build", [b for b in BUILDS if b])
@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 11), max_size=6)), max_size=60),
       threshold=st.sampled_from([0.05, 0.3, 1.0]))
def test_the_c_counts_and_guesses_are_numpys(build, ops, threshold):
    """The C build against numpy on the same calls, the wrap on, repeated and unordered ids (a repeat
    counts once, as numpy's fancy add): the same counts and the same guesses, in the same order."""
    c, ref = NextLayerPredictor(6, 12, threshold, wrap=True), NextLayerPredictor(6, 12, threshold, wrap=True)
    c.lib, ref.lib = kernels.load(build), None
    for layer, experts in ops:
        ids = np.array(experts, np.int64)
        c.observe(layer, ids)
        ref.observe(layer, ids)
        assert np.array_equal(c.pairs, ref.pairs) and np.array_equal(c.seen, ref.seen)
        assert c.predict(layer, ids).tolist() == ref.predict(layer, ids).tolist()


@pytest.mark.parametrize("build", [b for b in BUILDS if b])
def test_the_c_path_refuses_ids_outside_the_layer(build):
    """An id outside 0..E-1 is an IndexError from the C path too (numpy's fancy index raises), nothing counted."""
    pred = NextLayerPredictor(3, 4, 0.5)
    pred.lib = kernels.load(build)
    pred.observe(0, np.array([1]))
    with pytest.raises(IndexError):
        pred.observe(1, np.array([2, 4]))
    with pytest.raises(IndexError):
        pred.predict(0, np.array([-1]))
    assert not pred.pairs.any() and not pred.seen.any()


def test_a_deterministic_chain_is_predicted_after_one_token():
    pred = NextLayerPredictor(3, 4, 0.5)
    for layer, e in ((0, 1), (1, 3), (2, 0)):
        pred.observe(layer, np.array([e]))
    assert pred.predict(0, np.array([1])).tolist() == [3]
    assert pred.predict(1, np.array([3])).tolist() == [0]
    assert pred.predict(2, np.array([0])).tolist() == []          # no layer after the last
    assert pred.predict(0, np.array([2])).tolist() == []          # never seen: no guess


def test_threshold_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="prefetch threshold"):
        NextLayerPredictor(2, 2, 0.0)


token_calls = st.integers(1, 3).flatmap(lambda T: st.lists(st.tuples(
    st.integers(0, L - 1), st.lists(st.lists(st.integers(0, E - 1), min_size=2, max_size=2, unique=True),
                                    min_size=T, max_size=T)), max_size=12))


@settings(max_examples=100, deadline=None)
@given(ops=token_calls)
def test_prompt_rows_count_token_by_token(ops):
    """observe_tokens pairs row i of layer l with row i of the next call when it is layer l+1."""
    pred = NextLayerPredictor(L, E, 0.5)
    pairs, seen = np.zeros((L, E, E)), np.zeros((L, E))
    prev = None
    for layer, rows in ops:
        pred.observe_tokens(layer, np.array(rows))
        if prev is not None and layer == prev[0] + 1 and len(rows) == len(prev[1]):
            for a_row, b_row in zip(prev[1], rows):
                for a in a_row:
                    seen[layer - 1, a] += 1
                    for b in b_row:
                        pairs[layer - 1, a, b] += 1
        prev = (layer, rows)
    assert np.array_equal(pred.pairs, pairs) and np.array_equal(pred.seen, seen)


def path_reference(history, layer, experts, hops):
    """'+path': the mean over h = 1..hops of the hop-h estimate, P(b at layer+1 | the experts the
    current run of consecutive calls routed h-1 calls before this one), each counted from every
    run in the history (a run: calls of consecutive layers; a call h back in the same run)."""
    runs, run = [], []
    for call in history:
        run = run + [call] if run and call[0] == run[-1][0] + 1 else [call]
        runs.append(run)
    if layer + 1 >= L:
        return [0.0] * E
    terms = []
    for h in range(1, hops + 1):
        if h > 1 and len(runs[-1]) < h:
            break
        src_layer, src = (layer, experts) if h == 1 else runs[-1][-h]
        pairs, seen = {}, {}
        for r in runs:            # each call once, at the end of its own run
            if len(r) > h and r[-1 - h][0] == src_layer:
                for a in r[-1 - h][1]:
                    seen[a] = seen.get(a, 0) + 1
                    for b in r[-1][1]:
                        pairs[a, b] = pairs.get((a, b), 0) + 1
        terms.append([sum(pairs.get((a, b), 0) / max(seen.get(a, 0), 1) for a in src) / len(src) for b in range(E)])
    return np.mean(terms, axis=0)


@settings(max_examples=150, deadline=None)
@given(ops=calls, hops=st.integers(1, L))
def test_path_predictions_match_counts_from_the_history(ops, hops):
    pred = NextLayerPredictor(L, E, 0.5, hops=hops)
    history = []
    for layer, experts in ops:
        ids = np.array(sorted(experts), np.int64)
        pred.observe(layer, ids)
        history.append((layer, sorted(experts)))
        assert np.allclose(pred.probabilities(layer, ids), path_reference(history, layer, sorted(experts), hops))


def test_the_path_guesses_what_the_layer_before_decides():
    """Layer 2's expert follows layer 0's, layer 1 routes the same expert for every token: one hop
    sees a coin toss (0.5 each), the path of two layers the answer (0.75 against 0.25)."""
    one, path = NextLayerPredictor(3, 4, 0.6), NextLayerPredictor(3, 4, 0.6, hops=2)
    for token in ((0, 3, 1), (2, 3, 2)) * 3:
        for pred in (one, path):
            for layer, e in enumerate(token):
                pred.observe(layer, np.array([e]))
    for pred in (one, path):
        pred.observe(0, np.array([0]))
        pred.observe(1, np.array([3]))
    assert one.predict(1, np.array([3])).tolist() == []
    assert path.predict(1, np.array([3])).tolist() == [1]
    assert np.allclose(path.probabilities(1, np.array([3]))[[1, 2]], [0.75, 0.25])


@settings(max_examples=60, deadline=None)
@given(ops=token_calls, hops=st.integers(2, L))
def test_prompt_rows_count_every_hop_token_by_token(ops, hops):
    """observe_tokens pairs row i with row i of the call h back on a run of consecutive layers."""
    pred = NextLayerPredictor(L, E, 0.5, hops=hops)
    far, far_seen = np.zeros((hops - 1, L, E, E)), np.zeros((hops - 1, L, E))
    run = []
    for layer, rows in ops:
        pred.observe_tokens(layer, np.array(rows))
        run = run + [(layer, rows)] if run and layer == run[-1][0] + 1 else [(layer, rows)]
        for h in range(2, min(hops, len(run) - 1) + 1):
            m, prev = run[-1 - h]
            if len(prev) == len(rows):
                for a_row, b_row in zip(prev, rows):
                    for a in a_row:
                        far_seen[h - 2, m, a] += 1
                        for b in b_row:
                            far[h - 2, m, a, b] += 1
    assert np.array_equal(pred.far, far) and np.array_equal(pred.far_seen, far_seen)


def test_hops_out_of_range_are_a_clear_error():
    with pytest.raises(ValueError, match="path hops"):
        NextLayerPredictor(2, 2, 0.5, hops=3)
