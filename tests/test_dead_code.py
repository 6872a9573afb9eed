"""No function in freetoken/ is defined and never called: every function and method is named
somewhere else in the package (a call, an attribute read, a name passed on, a string such as a
registry entry). Framework hooks that something outside calls by name, and the few helpers
that only tests or benchmarks use, are listed here with why. An ast scan, no heuristics.

`python tests/test_dead_code.py` prints what it finds."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAIN_DECORATORS = {"property", "staticmethod", "classmethod", "cache", "lru_cache", "cached_property"}

# Called by a framework by name, never by our code.
HOOKS = {
    "do_POST": "http.server.BaseHTTPRequestHandler calls it (cli/agent_window's probe server)",
    "log_message": "http.server.BaseHTTPRequestHandler calls it (silenced)",
    "filter": "logging.Filter.filter, called by the logging module",
    "choose_replicas": "Ray Serve's RequestRouter calls it",
    "on_request_routed": "Ray Serve's RequestRouter calls it",
    "on_request_completed": "Ray Serve's RequestRouter calls it",
}

# Used by tests or benchmarks only, kept in the package with why.
FOR_TESTS_AND_BENCH = {
    "eager_capture": "the CUDA-graph capture contract on the CPU: tests and bench/gpu_check run the runner's "
                     "graph path through it where no device exists",
    "profile_q_rates": "bench/gpu_check reports the q* rates a profile entry gives, by the engine's own formula",
    "check_against": "the device decision's state against the host SlotTable: the tests' oracle lives beside it",
    "ggml_expert_nbytes": "the expert size rule for ggml banks, next to the bank layout it describes (tests)",
    "roofline": "the CPU expert roofline (bench/deepseek_v4_decode, tests): measurement API of experts/membw",
    "q_star": "the planner's q* rule as a function (tests and the simulator's projection check it)",
    "cpu_has_fast_bf16": "machine fact read by tests that pick the bf16 path the kernels would pick",
    "random_rows": "valid random ggml rows (finite fp16 scales) for tests and benchmarks of every type",
    "session_bodies": "request bodies from recorded sessions: bench/replicas, bench/soak_agents and the Ray test",
    "stream_from_keys": "synthetic access streams for the simulator's tests",
    "replay_hits": "a policy's hit sequence, the simulator tests' reference",
    "num_free": "BlockManager's free-block count: what the block accounting tests read",
    "mapped_nbytes": "bytes a host cache bank maps now: the resize tests check pages are given back",
    "conv_state_shape": "a linear-attention layer's state shapes (DeltaNet, KDA): the state tests size from them",
    "rec_state_shape": "as conv_state_shape",
    "prefilled": "prompt tokens no replica had cached: bench/vs_llamacpp and the replica tests report it",
    "load_sessions": "recorded agent sessions as token streams: bench/speculative and the suffix drafter's "
                     "reference test replay them (engine/spec/replay.py)",
    "tokens_per_verify": "a drafter's tokens per verify step on a replay: bench/speculative prints it, the "
                         "reference test compares it with a brute-force drafter",
    "f16_scale_offsets": "where each ggml type keeps its fp16 scales: tests and bench make valid blocks with it",
}


def _names_used(dirs: list[str]) -> Counter:
    c: Counter = Counter()
    for d in dirs:
        for f in (REPO / d).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(n, ast.Name):
                    c[n.id] += 1
                elif isinstance(n, ast.Attribute):
                    c[n.attr] += 1
                elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
                    c[n.value] += 1
                elif isinstance(n, ast.alias):
                    c[n.name.split(".")[-1]] += 1
    return c


def _decorator_name(d: ast.expr) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")


def functions() -> list[tuple[str, str]]:
    """(name, file:line) of every function and method a plain call would reach: dunders and
    functions a decorator registers (routes, handlers) are left out."""
    out = []
    for f in sorted((REPO / "freetoken").rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and all(_decorator_name(d) in PLAIN_DECORATORS for d in n.decorator_list)
                    and not (n.name.startswith("__") and n.name.endswith("__"))):
                out.append((n.name, f"{f.relative_to(REPO)}:{n.lineno}"))
    return out


def unused() -> tuple[list[str], list[str]]:
    """(never named anywhere, named only by tests/bench/tools and not listed)."""
    pkg, outside = _names_used(["freetoken"]), _names_used(["tests", "bench", "tools"])
    never, only_outside = [], []
    for name, where in functions():
        if pkg[name] or name in HOOKS:
            continue
        if not outside[name]:
            never.append(f"{where}: {name}")
        elif name not in FOR_TESTS_AND_BENCH:
            only_outside.append(f"{where}: {name}")
    return never, only_outside


def test_no_function_is_defined_and_never_called():
    never, only_outside = unused()
    assert not never, "functions nothing calls (remove them):\n" + "\n".join(never)
    assert not only_outside, ("functions only tests/bench call: move them beside their users or list them in "
                              "FOR_TESTS_AND_BENCH with why:\n" + "\n".join(only_outside))


def test_the_lists_name_only_functions_that_exist():
    names = {n for n, _ in functions()}
    stale = sorted((set(HOOKS) | set(FOR_TESTS_AND_BENCH)) - names)
    assert not stale, f"listed but not defined in freetoken/: {stale}"


if __name__ == "__main__":
    never, only_outside = unused()
    print("never called:", *never or ["none"], sep="\n  ")
    print("only tests/bench, not listed:", *only_outside or ["none"], sep="\n  ")
