"""Run in a fresh process: load a model with the engine (`MODEL`) or convert one to FTW
(`convert SRC OUT`), print peak (VmHWM) and settled (VmRSS) resident bytes as JSON. Used by
test_load_peak.py."""
import gc
import json
import sys


def status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


if __name__ == "__main__":
    import torch  # noqa: F401  -- the baseline: imports before the load

    from freetoken.llm import LLM
    from freetoken.loading.convert import convert
    base = status()
    if sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    else:
        llm = LLM(sys.argv[1], max_model_len=256, kv_cache_gib=0.01, max_num_seqs=1)
    gc.collect()
    print(json.dumps({"base": base["VmRSS"], "peak": status()["VmHWM"], "settled": status()["VmRSS"]}))
