"""cat_rows equals torch.cat, and is a view exactly when the parts lie back to back."""
from __future__ import annotations

import torch

from freetoken.layers.concat import cat_rows


def test_adjacent_parts_give_a_view_equal_to_cat():
    flat = torch.randn(10 * 4)
    parts = [flat[:12].view(3, 4), flat[12:20].view(2, 4), flat[20:40].view(5, 4)]
    got = cat_rows(parts)
    assert torch.equal(got, torch.cat(parts))
    assert got.data_ptr() == flat.data_ptr()


def test_non_adjacent_parts_are_copied():
    flat = torch.randn(20 * 4)
    cases = [
        [flat[:8].view(2, 4), flat[12:20].view(2, 4)],              # a gap
        [flat[8:16].view(2, 4), flat[:8].view(2, 4)],               # out of order
        [torch.randn(2, 4), torch.randn(3, 4)],                     # separate storages
        [flat[:8].view(2, 4), flat[8:16].view(2, 4).to(torch.float64)],
    ]
    for parts in cases:
        got = cat_rows(parts)
        want = torch.cat([p.to(parts[0].dtype) for p in parts]) if parts[0].dtype != parts[-1].dtype else torch.cat(parts)
        if parts[0].dtype == parts[-1].dtype:
            assert torch.equal(got, want)
        assert got.data_ptr() != flat.data_ptr() or parts[0].data_ptr() != flat.data_ptr()
