"""lm-evaluation-harness against the server: `lm_eval --model local-completions` scores a
small loglikelihood (multiple-choice) task whose data is a local file (no dataset hub here),
through /v1/completions with `echo` and `logprobs`, the way lm-eval talks to any
OpenAI-compatible server. Also scores each item in-process with `LLM.score` and prints both
accuracies, which must agree.

  pip install lm-eval==0.4.13          # not a FreeToken dependency
  PYTHONPATH=. python bench/lm_eval_local.py --model PATH.gguf|DIR [--port 8931]

The model's tokenizer is written out as a tokenizer.json directory for lm-eval (which counts
the context tokens itself and sends token ids)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

ITEMS = [  # question, choices, index of the answer
    ("The capital of France is", [" Paris", " London", " Berlin", " Madrid"], 0),
    ("Water freezes at a temperature of", [" zero degrees Celsius", " one hundred degrees Celsius", " fifty degrees"], 0),
    ("The opposite of hot is", [" cold", " blue", " fast"], 0),
    ("Two plus two equals", [" four", " seven", " nine"], 0),
    ("The sun rises in the", [" east", " west", " sea"], 0),
    ("A baby cat is called a", [" kitten", " puppy", " calf"], 0),
    ("The color of the sky on a clear day is", [" blue", " green", " red"], 0),
    ("The first day of the week after Sunday is", [" Monday", " Friday", " Thursday"], 0),
    ("Bees make", [" honey", " steel", " glass"], 0),
    ("The largest ocean on Earth is the", [" Pacific", " Arctic", " Indian"], 0),
    ("To write on paper you can use a", [" pen", " spoon", " shoe"], 0),
    ("Ice is frozen", [" water", " sand", " wood"], 0),
]

TASK = """task: ft_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_task(d: Path) -> None:
    data = d / "data.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in ITEMS))
    (d / "ft_local_mc.yaml").write_text(TASK.format(data=data))


def write_tokenizer(model: str, d: Path) -> None:
    from freetoken.tokenizer import Tokenizer
    tok = Tokenizer(model)
    tok.hf.save(str(d / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token, "eos_token": tok.eos_token}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


def in_process_scores(model: str) -> list[list[float]]:
    """The same items scored with LLM.score: per choice, the sum of the continuation's logprobs."""
    from freetoken import LLM
    llm = LLM(model, dtype="float32", max_model_len=512, kv_cache_gib=0.05)
    tok = llm.tokenizer
    out = []
    for q, choices, _ in ITEMS:
        ctx = tok.encode(q)
        scores = []
        for c in choices:
            whole = tok.encode(q + c)
            lp = torch.log_softmax(llm.score(whole).double(), dim=-1)
            scores.append(sum(float(lp[j - 1, whole[j]]) for j in range(len(ctx), len(whole))))
        out.append(scores)
    llm.close()
    return out


def lm_eval_scores(out_dir: Path) -> list[list[float]]:
    """Per item (in ITEMS order), lm-eval's loglikelihood of each choice (--log_samples)."""
    rows = [json.loads(ln) for f in out_dir.rglob("samples_ft_local_mc_*.jsonl") for ln in f.read_text().splitlines()]
    rows.sort(key=lambda r: r["doc_id"])
    return [[float(r[0]) for r in row["filtered_resps"]] for row in rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=8931)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ft-lmeval-"))
    (work / "tok").mkdir()
    write_task(work)
    write_tokenizer(a.model, work / "tok")
    log = work / "serve.log"
    srv = subprocess.Popen([sys.executable, "-m", "freetoken.cli", "serve", "--model", a.model, "--port", str(a.port),
                            "--served-model-name", "m", "--max-model-len", "512", "--kv-cache-gib", "0.1",
                            "--dtype", "float32"],
                           stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "READY http" not in log.read_text():
            if srv.poll() is not None or time.monotonic() > deadline:
                print(log.read_text()[-3000:])
                return 1
            time.sleep(1)
        base = f"http://127.0.0.1:{a.port}"
        httpx.get(base + "/health", timeout=30).raise_for_status()
        t0 = time.monotonic()
        cmd = ["lm_eval", "--model", "local-completions", "--model_args",
               f"model=m,base_url={base}/v1/completions,tokenizer_backend=huggingface,tokenizer={work / 'tok'},"
               "num_concurrent=1,max_retries=1,tokenized_requests=True",
               "--tasks", "ft_local_mc", "--include_path", str(work), "--output_path", str(work / "out"), "--log_samples"]
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        r = subprocess.run([Path(sys.executable).with_name("lm_eval"), *cmd[1:]], capture_output=True, text=True,
                           env=env, timeout=1200)
        print(r.stdout[-3000:])
        if r.returncode != 0:
            print(r.stderr[-4000:])
            return r.returncode
        got = json.loads(next((work / "out").rglob("results_*.json")).read_text())["results"]["ft_local_mc"]
        print(f"lm_eval local-completions: acc {got['acc,none']:.3f} on {len(ITEMS)} items "
              f"({time.monotonic() - t0:.1f} s)")
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(60)
    ref = in_process_scores(a.model)
    served = lm_eval_scores(work / "out")
    acc = sum(max(range(len(r)), key=r.__getitem__) == it[2] for r, it in zip(ref, ITEMS)) / len(ITEMS)
    diff = max(abs(x - y) for r, s in zip(ref, served) for x, y in zip(r, s))
    print(f"LLM.score in-process:       acc {acc:.3f}; largest |loglikelihood difference| over "
          f"{sum(map(len, ref))} choices: {diff:.2e}")
    return 0 if len(served) == len(ITEMS) and diff < 1e-3 and abs(acc - got["acc,none"]) < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
