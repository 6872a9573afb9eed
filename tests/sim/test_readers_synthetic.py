"""Readers on small hand-made files: parsing, drops, and one-line errors naming file and field."""

import json

import pytest
import torch

from freetoken.sim.readers import load_trace
from freetoken.sim.trace import DECODE, PREFILL, TraceError
from freetoken.experts.measure.trace_format import TraceWriter

HEADER = {"num_layers": 2, "num_experts": 4, "top_k": 2, "model": "tiny"}


def test_writer_round_trip_with_tensors_lists_and_a_missing_cell(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, HEADER) as w:
        for layer in range(2):
            w.write("prefill", 0, layer, torch.tensor([[0, 1], [1, 2], [3, 0]]), torch.tensor([[0.6, 0.4]] * 3))
        w.write("decode", 3, 0, [[2, 3]])
        w.write("decode", 3, 1, torch.tensor([1, 0]))  # a 1-D row is one token
        w.write("decode", 4, 1, [[0, 2]])  # layer 0 of step 4 lost
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"format": "freetoken-routing-trace", "version": 1, **HEADER}
    assert json.loads(lines[1])["weights"] == [[0.6, 0.4]] * 3
    t = load_trace(path)
    assert [(c.phase, c.step, c.layer, c.rows) for c in t.cells] == [
        (PREFILL, 0, 0, ((0, 1), (1, 2), (3, 0))),
        (PREFILL, 0, 1, ((0, 1), (1, 2), (3, 0))),
        (DECODE, 3, 0, ((2, 3),)),
        (DECODE, 3, 1, ((1, 0),)),
        (DECODE, 4, 1, ((0, 2),)),
    ]
    assert t.missing == [(0, DECODE, 4, 0)]


def test_writer_buffers_until_close(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TraceWriter(path, HEADER, buffer_lines=100)
    w.write("decode", 0, 0, [[1, 2]])
    assert path.read_text() == ""
    w.close()
    assert len(path.read_text().splitlines()) == 2


def test_writer_requires_header_fields(tmp_path):
    with pytest.raises(ValueError, match="top_k"):
        TraceWriter(tmp_path / "t.jsonl", {"num_layers": 1, "num_experts": 2, "model": "m"})


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "name, text, field",
    [
        ("a.jsonl", '{"format": "freetoken-routing-trace", "version": 2}\n', "version"),
        ("b.jsonl", '{"format": "freetoken-routing-trace", "version": 1, "num_layers": 2}\n', "num_experts"),
        ("c.jsonl", json.dumps({"format": "freetoken-routing-trace", "version": 1, **HEADER}) + '\n{"phase": "decode", "step": 0, "layer": 5, "experts": [[1]]}\n', "layer"),
        ("d.jsonl", json.dumps({"format": "freetoken-routing-trace", "version": 1, **HEADER}) + '\n{"phase": "chat", "step": 0, "layer": 0, "experts": [[1]]}\n', "phase"),
        ("e.jsonl", json.dumps({"format": "freetoken-routing-trace", "version": 1, **HEADER}) + '\n{"phase": "decode", "step": 0, "layer": 0, "experts": [[9]]}\n', "expert id 9"),
        ("f.jsonl", '{"layer": 0, "token_pos": 0, "experts": "x"}\n', "experts"),
        ("g.jsonl", '{"layer": 0, "token_idx": 0, "experts": [1, 2]}\n{oops\n', ":2"),
        ("h.csv", "# route_trace v1\n# model=m n_layer=1 n_expert=2 n_expert_used=1\nturn,phase,step\n", "header"),
        ("i.csv", "# route_trace v1\n# model=m n_layer=1 n_expert=2 n_expert_used=1\n"
         "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n0,7,0,0,0,1,1.0,0,0\n", "phase"),
        ("j.csv", "# route_trace v1\n# model=m n_layer=1\n", "n_expert"),
        ("k.txt", "hello\n", "unrecognised"),
    ],
)
def test_bad_files_raise_one_line_naming_file_and_field(tmp_path, name, text, field):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert name in message and field in message and "\n" not in message


def test_vllm_raw_splits_forward_calls_and_reports_drops(tmp_path):
    recs = [(0, 0, [0, 1]), (0, 1, [1, 2]), (1, 0, [2, 3]), (1, 1, [3, 0]),  # prefill of 2 tokens
            (0, 0, [1, 0]), (1, 0, [2, 0]),  # decode step 2
            (1, 0, [3, 1]),  # decode step 3, layer 0 dropped
            (0, 0, [0, 2])]  # decode step 4, layer 1 dropped
    path = write(tmp_path, "raw.jsonl", "".join(json.dumps({"problem_id": 0, "layer": l, "token_pos": p, "experts": e}) + "\n" for l, p, e in recs))
    t = load_trace(path)
    assert [(c.phase, c.step, c.layer) for c in t.cells] == [
        (PREFILL, 0, 0), (PREFILL, 1, 0), (PREFILL, 0, 1), (PREFILL, 1, 1),
        (DECODE, 2, 0), (DECODE, 2, 1), (DECODE, 3, 1), (DECODE, 4, 0),
    ]
    assert sorted(t.missing) == [(0, DECODE, 3, 0), (0, DECODE, 4, 1)]


def test_route_csv_sorts_into_time_order(tmp_path):
    text = ("# route_trace v1\n# model=/x/m.gguf arch=a n_layer=2 n_expert=4 n_expert_used=1\n"
            "# layer=0 expert_bytes=10 dense_bytes=5\n# layer=1 expert_bytes=20 dense_bytes=5\n"
            "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
            "0,0,0,0,0,1,1.0,0,0\n0,0,1,0,0,2,1.0,0,0\n0,0,1,1,0,3,1.0,0,0\n"
            "0,1,2,0,0,0,1.0,1,0\n0,1,2,1,0,1,1.0,0,0\n0,1,3,0,0,2,1.0,0,0\n")
    t = load_trace(write(tmp_path, "r.csv", text))
    assert t.model == "m.gguf" and t.expert_bytes == [10, 20] and t.dense_bytes == [5, 5]
    assert [(c.phase, c.step, c.layer, c.rows) for c in t.cells][-3:] == [
        (DECODE, 2, 0, ((0,),)), (DECODE, 2, 1, ((1,),)), (DECODE, 3, 0, ((2,),))]
    assert t.missing == [(0, DECODE, 3, 1)]
