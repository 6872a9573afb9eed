"""Where FreeToken's arithmetic parts from llama.cpp's, op by op, on one GGUF (outside CI):

    .venv/bin/python bench/llamacpp_dump.py [--model FILE.gguf|smollm2] [--tokens 48] [--decode 0]
                                           [--ggml-numerics llama-exact|llama|q8|float32] [--layers 30]

llama.cpp (llama-cpp-python's low-level API, AMX refused as in vs_llamacpp.py, flash attention
off, one thread) runs the first --tokens tokens of bench/quality_text.py's text as one batch,
then --decode single-token steps (the tokens FreeToken chose greedily), with a `cb_eval` callback
that copies every graph tensor it computes (its name, e.g. "attn_norm-0", "Qcur-0", "kqv_out-0",
"ffn_out-0", "l_out-0"). FreeToken runs the same tokens with its layers wrapped to record their
inputs and outputs. For each layer, in graph order, two columns per op:
  chained   FreeToken's own tensor vs llama.cpp's (share of bit-identical values, relative error);
  isolated  FreeToken's op applied to llama.cpp's *input* of that op vs llama.cpp's output: the
            op's own arithmetic, free of what earlier ops left.
It then names the first op whose isolated output is not bit-identical: where the two engines'
arithmetic parts (with --ggml-numerics llama-exact: nowhere, on SmolLM2 Q4_1). Q and K compare
in the GGUF's row order (its converter permutes Llama's q/k rows; FreeToken un-permutes them).
The last layer's rows after attention are the last token's only (llama.cpp computes no more)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quality_text import stdlib_docstrings  # noqa: E402
from real_models import resolve  # noqa: E402
from vs_llamacpp import NO_AMX  # noqa: E402

DUMP_CHILD = NO_AMX + """
import ctypes, json, sys
import numpy as np
import llama_cpp as L
from llama_cpp._ggml import libggml
for f in ("ggml_get_name", "ggml_op_desc"):
    getattr(libggml, f).restype, getattr(libggml, f).argtypes = ctypes.c_char_p, [ctypes.c_void_p]
job = json.loads(open(sys.argv[1]).read())
NP, SKIP = {0: np.float32, 1: np.float16}, ("VIEW", "PERMUTE", "RESHAPE", "TRANSPOSE", "SET_ROWS", "NONE")
out, step = {}, [0]
def cb(t, ask, user):      # struct ggml_tensor: type @0, ne[4] @16, nb[4] @48, data @248
    if ask:
        return True
    name, op = libggml.ggml_get_name(t).decode(), libggml.ggml_op_desc(t).decode()
    typ = ctypes.c_int.from_address(t).value
    if typ in NP and op not in SKIP:
        ne, nb = list((ctypes.c_int64 * 4).from_address(t + 16)), list((ctypes.c_size_t * 4).from_address(t + 48))
        dt = np.dtype(NP[typ])
        size = sum((n - 1) * b for n, b in zip(ne, nb)) + dt.itemsize
        buf = (ctypes.c_char * size).from_address(ctypes.c_void_p.from_address(t + 248).value)
        a = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=dt), shape=ne[::-1], strides=nb[::-1])
        key = f"{step[0]}|{name}|{op}"
        while key in out:
            key += "'"
        out[key] = a.copy()
    return True
CB = L.ggml_backend_sched_eval_callback(cb)
L.llama_backend_init()
model = L.llama_model_load_from_file(job["model"].encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = cp.n_batch = cp.n_ubatch = 512 * (1 + (len(job["tokens"]) + 1) // 512)
cp.n_threads = cp.n_threads_batch = 1
cp.flash_attn_type, cp.cb_eval = 0, CB
ctx = L.llama_init_from_model(model, cp)
pos = 0
for n in job["steps"]:
    arr = (L.llama_token * n)(*job["tokens"][pos:pos + n])
    assert L.llama_decode(ctx, L.llama_batch_get_one(arr, n)) == 0, "llama_decode failed"
    pos, step[0] = pos + n, step[0] + 1
np.savez(job["out"], **out)
"""


def llama_tensors(model: Path, tokens: list[int], steps: list[int], d: str) -> dict:
    job = Path(d) / "job.json"
    job.write_text(json.dumps(dict(model=str(model), tokens=tokens, steps=steps, out=f"{d}/dump.npz")))
    p = subprocess.run([sys.executable, "-c", DUMP_CHILD, str(job)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llama.cpp child failed:\n{p.stderr[-3000:]}")
    return dict(np.load(f"{d}/dump.npz"))


def record(model) -> tuple[dict, dict]:
    """Wrap each layer's norms, linears and activation: (calls {key: [(input, output)]}, the unwrapped callables)."""
    calls, orig = {}, {}

    def wrap(obj, attr, key):
        f = orig[key] = getattr(obj, attr)

        def g(x, *a, **k):
            y = f(x, *a, **k)
            calls.setdefault(key, []).append((x.detach().clone(), y.detach().clone()))
            return y
        setattr(obj, attr, g)
    for i, layer in enumerate(model.layers):
        attn = layer.attn.__dict__.get("attn", layer.attn)      # llama-exact wraps the Attention
        for obj, attr, key in ((layer, "input_norm", "attn_norm"), (attn, "qkv", "qkv"), (attn, "o", "attn_out"),
                               (layer, "post_norm", "ffn_norm"), (layer.mlp, "gate_up", "gate_up"),
                               (layer.mlp, "act", "act"), (layer.mlp, "down", "ffn_out")):
            wrap(obj, attr, f"{key}-{i}")
    return calls, orig


def gguf_order(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, H * D] in FreeToken's un-permuted q/k order -> the GGUF rows' (pairs (i, i + D/2) side by side)."""
    return x.unflatten(-1, (-1, 2, head_dim // 2)).transpose(-1, -2).flatten(-3)


def compare(ours: torch.Tensor, theirs: np.ndarray) -> tuple[float, float]:
    """(share of bit-identical values, relative error) of ours against llama.cpp's (its rows: the last ones)."""
    t = torch.from_numpy(np.ascontiguousarray(theirs)).float().reshape(-1, ours.shape[-1])
    o = ours.float().reshape(-1, ours.shape[-1])[-t.shape[0]:]
    return (o == t).double().mean().item(), ((o - t).double().norm() / t.double().norm().clamp_min(1e-30)).item()


def fmt(c) -> str:
    return "-" if c is None else f"{c[0] * 100:8.3f}% {c[1]:8.1e}"


def layer_rows(i: int, m, calls: dict, orig: dict, ll) -> list[tuple]:
    """(op, chained, isolated) of layer i, the last call (the last step) of each wrapped op."""
    t = lambda name: torch.from_numpy(np.ascontiguousarray(ll(name))).float()  # noqa: E731
    last = lambda key: calls[f"{key}-{i}"][-1]  # noqa: E731
    hq, hk = m.layers[i].attn.heads * m.head_dim, m.layers[i].attn.kv_heads * m.head_dim
    x_in = t("embd" if i == 0 else f"l_out-{i - 1}")
    an, qkv, o_in = t(f"attn_norm-{i}").reshape(-1, m.hidden), last("qkv")[1], t(f"kqv_out-{i}").reshape(-1, hq)
    iso_qkv = orig[f"qkv-{i}"](an)
    rows = [("attn_norm", compare(last("attn_norm")[1], ll(f"attn_norm-{i}")),
             compare(orig[f"attn_norm-{i}"](x_in.reshape(-1, m.hidden)), ll(f"attn_norm-{i}")))]
    for name, a, b, perm in (("Qcur", 0, hq, True), ("Kcur", hq, hq + hk, True), ("Vcur", hq + hk, hq + 2 * hk, False)):
        f = (lambda y: gguf_order(y, m.head_dim)) if perm else (lambda y: y)
        rows.append((name, compare(f(qkv[:, a:b]), ll(f"{name}-{i}", "MUL_MAT")), compare(f(iso_qkv[:, a:b]),
                                                                                         ll(f"{name}-{i}", "MUL_MAT"))))
    rows.append(("kqv_out (attention)", compare(last("attn_out")[0], ll(f"kqv_out-{i}")), None))
    rows.append(("attn_out", compare(last("attn_out")[1], ll(f"attn_out-{i}")),
                 compare(orig[f"attn_out-{i}"](o_in), ll(f"attn_out-{i}"))))
    fn, inter = t(f"ffn_norm-{i}").reshape(-1, m.hidden), m.layers[i].mlp.inter
    gu, iso_gu = last("gate_up")[1], orig[f"gate_up-{i}"](fn)
    gate, up = t(f"ffn_gate-{i}").reshape(-1, inter), t(f"ffn_up-{i}").reshape(-1, inter)
    rows += [("ffn_norm", compare(last("ffn_norm")[1], ll(f"ffn_norm-{i}")),
              compare(orig[f"ffn_norm-{i}"](t(f"ffn_inp-{i}").reshape(-1, m.hidden)), ll(f"ffn_norm-{i}"))),
             ("ffn_gate", compare(gu[:, :inter], ll(f"ffn_gate-{i}")), compare(iso_gu[:, :inter], ll(f"ffn_gate-{i}"))),
             ("ffn_up", compare(gu[:, inter:], ll(f"ffn_up-{i}")), compare(iso_gu[:, inter:], ll(f"ffn_up-{i}"))),
             ("ffn_swiglu", compare(last("ffn_out")[0], ll(f"ffn_swiglu-{i}")),
              compare(orig[f"act-{i}"](gate) * up, ll(f"ffn_swiglu-{i}"))),
             ("ffn_out", compare(last("ffn_out")[1], ll(f"ffn_out-{i}")),
              compare(orig[f"ffn_out-{i}"](t(f"ffn_swiglu-{i}").reshape(-1, inter)), ll(f"ffn_out-{i}")))]
    return rows


def run(model: Path, tokens: int, decode: int, numerics: str, layers: int | None = None):
    """([(layer, op, chained, isolated)], (FreeToken's argmax, llama.cpp's) of the last step)."""
    from freetoken import LLM, SamplingParams
    llm = LLM(str(model), dtype="float32", num_threads=1, prefix_cache=False, ggml_numerics=numerics,
              max_model_len=max(1024, tokens + decode + 16))
    ids = llm.tokenizer.encode(stdlib_docstrings()[:20 * tokens])[:tokens]
    m = llm.engine.model
    calls, orig = record(m)
    logits, head = [], m.compute_logits
    m.compute_logits = lambda h: logits.append(head(h)) or logits[-1]
    if decode:
        out = llm.generate([ids], SamplingParams(max_tokens=decode, temperature=0.0, ignore_eos=True))[0]
        ids = ids + list(out.token_ids)[:decode - 1]
    else:
        llm.score(ids)
    steps = [tokens] + [1] * max(decode - 1, 0)
    with tempfile.TemporaryDirectory() as d:
        dump = llama_tensors(model, ids, steps, d)
    last = str(len(steps) - 1)

    def ll(name, op=None):
        keys = [k for k in dump if k.split("|")[:2] == [last, name] and (op is None or k.split("|")[2] == op)]
        if not keys:
            raise SystemExit(f"llama.cpp's graph has no tensor {name!r} (op {op}): not a Llama-style graph?")
        return dump[keys[0]]
    rows = [(i, *r) for i in range(min(layers or m.num_layers, m.num_layers)) for r in layer_rows(i, m, calls, orig, ll)]
    final, theirs = logits[-1], ll("result_output").reshape(-1)
    rows.append(("", "result_output", compare(final, theirs[-final.shape[-1]:]), None))
    llm.close()
    return rows, (int(final[-1].argmax()), int(np.argmax(theirs[-final.shape[-1]:])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=48, help="prompt tokens (one batch in both engines)")
    ap.add_argument("--decode", type=int, default=0, help="then this many one-token steps (compared: the last)")
    ap.add_argument("--ggml-numerics", default="llama-exact", choices=("auto", "q8", "llama", "llama-exact", "float32"))
    ap.add_argument("--layers", type=int, default=None, help="compare the first N layers (default all)")
    args = ap.parse_args()
    model = resolve(args.model)
    rows, (ours, theirs) = run(model, args.tokens, args.decode, args.ggml_numerics, args.layers)
    print(f"model {model}; {args.tokens} prompt tokens"
          f"{f', {args.decode} decode steps (the last compared)' if args.decode else ''}; FreeToken --ggml-numerics "
          f"{args.ggml_numerics}\n{'layer':>5} {'op':<20} {'chained: same bits, rel':>26} {'isolated: same bits, rel':>27}")
    for i, op, chained, isolated in rows:
        print(f"{i:>5} {op:<20} {fmt(chained):>26} {fmt(isolated):>27}")
    print(f"next token: FreeToken {ours}, llama.cpp {theirs}")
    first = next((r for r in rows if r[3] is not None and r[3][0] < 1), None)
    print("first op whose own arithmetic differs from llama.cpp's: " +
          (f"layer {first[0]} {first[1]} ({fmt(first[3]).strip()})" if first else
           "none (every op bit-identical in isolation)"))


if __name__ == "__main__":
    main()
