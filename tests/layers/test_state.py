import torch

from freetoken.layers.deltanet import GatedDeltaNet
from freetoken.layers.linear import Linear
from freetoken.layers.state import DeltaNetState, SequenceState, SlidingWindowKV


def _layer():
    torch.manual_seed(0)
    h, hk, hv, dk, dv, kw = 24, 2, 4, 8, 6, 4
    conv_dim = 2 * hk * dk + hv * dv
    lin = lambda w: Linear(w, compute_dtype=torch.float32)  # noqa: E731
    return GatedDeltaNet(lin(torch.randn(conv_dim + hv * dv + 2 * hv, h) * 0.3), torch.randn(conv_dim, kw) * 0.3,
                         torch.rand(hv), torch.rand(hv).log(), torch.rand(dv) + 0.5, lin(torch.randn(h, hv * dv) * 0.3),
                         hk, dk, dv, 1e-6)


def test_deltanet_snapshot_restore_resumes_exactly():
    layer = _layer()
    st = DeltaNetState(1, layer.conv_state_shape, layer.rec_state_shape)
    x = torch.randn(1, 50, 24)
    full, _, _ = layer(x)

    def feed(chunk):
        out, st.conv[0:1], st.rec[0:1] = layer(chunk, st.conv[0:1], st.rec[0:1])
        st.position += chunk.shape[1]
        return out

    feed(x[:, :30])
    snap = st.snapshot()
    assert snap.nbytes == st.nbytes > 0 and snap.position == 30
    feed(torch.randn(1, 7, 24))          # diverge: another continuation
    st.restore(snap)
    assert st.position == 30
    outs = [feed(x[:, 30:31]), feed(x[:, 31:])]
    torch.testing.assert_close(torch.cat(outs, 1), full[:, 30:], atol=1e-5, rtol=1e-4)


def test_snapshot_is_a_copy():
    st = DeltaNetState(2, (5, 3), (2, 4, 4))
    snap = st.snapshot()
    st.rec += 1
    st.conv += 1
    assert snap.rec.abs().sum() == 0 and snap.conv.abs().sum() == 0
    assert snap.nbytes == 2 * 5 * 3 * 4 + 2 * 2 * 4 * 4 * 4


def test_sliding_window_ring_buffer():
    w = SlidingWindowKV(num_layers=2, window=4, kv_heads=1, head_dim=2)
    k = torch.arange(20.).view(10, 1, 2)
    w.write(1, 0, k[:3], -k[:3])
    w.position = 3
    w.write(1, 3, k[3:10], -k[3:10])
    w.position = 10
    kk, vv, pos = w.cached(1, 10)
    assert pos.tolist() == [6, 7, 8, 9]
    torch.testing.assert_close(kk, k[6:10])
    torch.testing.assert_close(vv, -k[6:10])
    snap = w.snapshot()
    w.write(1, 10, k[:2], k[:2])
    w.restore(snap)
    torch.testing.assert_close(w.cached(1, 10)[0], k[6:10])
    assert w.nbytes == 2 * 2 * 4 * 1 * 2 * 4


def test_sequence_state_groups_parts():
    s = SequenceState({"dn": DeltaNetState(1, (2, 3), (1, 2, 2)), "sw": SlidingWindowKV(1, 4, 1, 2)})
    s.advance(5)
    snap = s.snapshot()
    assert snap.position == 5 and snap.nbytes == s.nbytes
    s.advance(3)
    s.restore(snap)
    assert s.position == 5
