"""Fuzz every route from the server's own OpenAPI schema (schemathesis strategies driven by
hypothesis, seeded and bounded), valid and schema-violating bodies, then the hand-written
hostile cases. Every answer must be < 500, every 4xx in its protocol's error shape, every
200 stream must end with its protocol's final event, and the server must still be healthy
with no 5xx counted at the end.

The server runs in this process on 127.0.0.1 over the scripted engine (fast, so thousands of
cases fit in a minute) or the random-weight tiny model (--engine tiny: real tokenizer, chat
template and grammar compiler).

    python bench/fuzz.py --cases 150 --seed 0            # ~2,500 generated cases
    python bench/fuzz.py --cases 20 --engine tiny
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "server")]     # this checkout's freetoken

STREAM_END = {"/v1/chat/completions": ("data: [DONE]",), "/v1/completions": ("data: [DONE]",),
              "/v1/messages": ("event: message_stop", "event: error"),
              "/v1/responses": ("event: response.completed", "event: response.incomplete", "event: error")}

# What the generic `list[dict]` fields hold, so generated requests get past the first check
# and reach the converters, templates and engine (the schema itself stays the server's).
_PART = {"type": "object", "properties": {"type": {"enum": ["text", "image_url", "input_text", "tool_result",
                                                            "tool_use", "thinking", "refusal", "other"]},
                                          "text": {}, "content": {}, "input": {}, "name": {}, "id": {}}}
_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function", "other"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _PART}, {"type": "null"}]},
    "tool_calls": {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "string"}, "function": {"type": "object", "properties": {
            "name": {"type": "string"}, "arguments": {}}}}}},
    "tool_call_id": {}, "name": {}, "reasoning_content": {}}}
_TOOL = {"type": "object", "properties": {
    "type": {"enum": ["function", "custom", "web_search"]}, "name": {"type": "string"},
    "function": {"type": "object", "properties": {"name": {"type": "string"}, "parameters": {}}},
    "input_schema": {}, "parameters": {}}}


def fuzz_schema(app, model_names: list[str]) -> dict:
    schema = copy.deepcopy(app.openapi())
    for path, ops in schema["paths"].items():
        for op in ops.values():
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            if not body:
                continue
            props = body.get("properties", {})
            anthropic = path.startswith("/v1/messages")
            if "model" in props:    # unknown ids are a 404 on OpenAI routes: the hostile cases cover it
                props["model"] = {"enum": model_names + (["claude-fuzz"] if anthropic else [])}
            if "messages" in props:
                msg = copy.deepcopy(_MESSAGE)
                if anthropic:
                    msg["properties"]["role"] = {"enum": ["user", "assistant"]}
                props["messages"] = {"type": "array", "items": msg, "minItems": 1, "maxItems": 4}
            if "input" in props:
                props["input"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {}, "maxItems": 4}]}
            if "tools" in props:
                props["tools"] = {"anyOf": [{"type": "array", "items": _TOOL, "maxItems": 3}, {"type": "null"}]}
            for k in ("max_tokens", "max_output_tokens", "max_completion_tokens"):
                if k in props:      # mostly small budgets, and some that are not (negative, huge)
                    props[k] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 16}, {"type": "integer"}]}
    return schema


def protocol_problem(path: str, status: int, text: str, streamed: bool) -> str | None:
    if status >= 500:
        return f"{status}: {text[:200]}"
    if 400 <= status < 500:
        try:
            body = json.loads(text)
        except ValueError:
            return f"{status} with a body that is not JSON: {text[:100]}"
        if path.startswith("/v1/messages"):
            ok = body.get("type") == "error" and isinstance(body.get("error"), dict) and body["error"].get("message")
        else:
            ok = isinstance(body.get("error"), dict) and body["error"].get("message") and body["error"].get("type")
        return None if ok else f"{status} not in the protocol's error shape: {text[:200]}"
    if status == 200 and streamed and path in STREAM_END:
        tail = text.rstrip().rsplit("\n\n", 1)[-1]
        if not any(tail.startswith(end) for end in STREAM_END[path]):
            return f"stream did not end with its final event: ...{text[-200:]!r}"
    if "Traceback" in text:
        return "a traceback in the reply"
    return None


def run(url: str, schema: dict, cases: int, seed: int, grammar: bool = True) -> dict:
    """grammar=False: the engine has no real tokenizer for constrained output (the scripted
    one), so the hand-written grammar cases are left to the tiny-model run."""
    import httpx
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from hostile_cases import CASES, encoded

    warnings.simplefilter("ignore")
    api = schemathesis.openapi.from_dict(schema)
    stats: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    t0 = time.monotonic()
    client = httpx.Client(base_url=url, timeout=60)
    for result in api.get_all_operations():
        op = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            key = f"{op.method.upper()} {op.path} {mode.value}"
            counts = stats.setdefault(key, {})

            @settings(max_examples=cases, database=None, derandomize=False, deadline=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case):
                path = case.formatted_path
                kw = {"headers": {k: v for k, v in (case.headers or {}).items() if isinstance(v, str)}}
                if type(case.body).__name__ != "NotSet":     # schemathesis' "no body" sentinel
                    kw["content"] = (case.body if isinstance(case.body, bytes)
                                     else json.dumps(case.body, allow_nan=True, default=str).encode())
                    kw["headers"]["content-type"] = "application/json"
                r = client.request(case.method, path, params=case.query or None, **kw)
                counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
                streamed = isinstance(case.body, dict) and case.body.get("stream") is True
                why = protocol_problem(path, r.status_code, r.text, streamed)
                if why:
                    problems.append(f"{case.method} {path} body={json.dumps(case.body, default=str)[:300]}: {why}")

            try:
                _seeded(check, seed)()
            except Unsatisfiable:     # nothing to violate (a route without parameters or body)
                pass
    hostile = {}
    for name, path, body in CASES:
        if not grammar and ("response_format-" in name and "type" not in name or "forced" in name):
            continue
        r = client.post(path, content=encoded(body), headers={"content-type": "application/json"})
        hostile[name] = r.status_code
        why = protocol_problem(path, r.status_code, r.text, False)
        if why:
            problems.append(f"hostile {name}: {why}")
    health = client.get("/health").json()
    metrics = client.get("/metrics").text
    server_5xx = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith('freetoken_http_errors_total{status="5'))
    client.close()
    generated = sum(sum(c.values()) for c in stats.values())
    return {"generated_cases": generated, "hostile_cases": len(hostile), "elapsed_s": round(time.monotonic() - t0, 1),
            "by_operation": stats, "hostile": hostile, "problems": problems, "health": health["status"],
            "server_5xx": server_5xx,
            "ok": not problems and health["status"] == "ok" and server_5xx == 0}


def _seeded(fn, seed: int):
    from hypothesis import seed as hseed
    return hseed(seed)(fn)


def start(engine: str):
    """(url, svc, stop) of a server on 127.0.0.1 in this process."""
    from live_server import MODEL_NAMES, LiveServer, make_fake

    from freetoken.server.app import create_app
    from freetoken.server.generation import GenerationService
    from freetoken.server.server_state import ServerSettings
    if engine == "fake":
        _, svc, app = make_fake(max_body_bytes=1 << 20)
        srv = LiveServer(app)
        return srv.url, svc, app, srv.stop
    import tempfile

    from freetoken import LLM
    from freetoken.tiny import make_tiny
    d = make_tiny("qwen3_moe", Path(tempfile.mkdtemp()) / "tiny", max_position_embeddings=4096)
    llm = LLM(str(d), dtype="float32", max_model_len=4096, max_num_seqs=8, kv_cache_gib=0.25)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=8, max_waiting=64, max_tokens_cap=8)
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, max_body_bytes=1 << 20))
    srv = LiveServer(app)

    def stop():
        srv.stop()
        llm.close()
    return srv.url, svc, app, stop


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=150, help="generated cases per operation and mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=["fake", "tiny"], default="fake")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from live_server import MODEL_NAMES
    url, svc, app, stop = start(args.engine)
    try:
        r = run(url, fuzz_schema(app, MODEL_NAMES), args.cases, args.seed, grammar=args.engine != "fake")
    finally:
        stop()
    print(f"fuzz ({args.engine} engine, seed {args.seed}): {r['generated_cases']} generated cases over "
          f"{len(r['by_operation'])} operation/mode pairs + {r['hostile_cases']} hostile cases in {r['elapsed_s']} s")
    for key, counts in sorted(r["by_operation"].items()):
        print(f"  {key}: {dict(sorted(counts.items()))}")
    print(f"  server 5xx counted: {r['server_5xx']:.0f}; /health: {r['health']}; problems: {len(r['problems'])}")
    for pr in r["problems"][:20]:
        print("  PROBLEM", pr)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
