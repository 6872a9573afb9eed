"""The built-in web page in a real headless Chromium (the system's, driven by Playwright):
it loads behind --api-key (asks for the key, keeps it in sessionStorage), a chat round trip
streams (reasoning folded, tool calls shown), and every number the dashboard shows equals
/metrics: the totals it reads from /metrics, and the heat map's per-layer sums, which come
from /api/stats's per-(layer, expert) counters. Over a real tiny MoE on the hybrid backend."""
from __future__ import annotations

import math
import os
import shutil
import time

import httpx
import pytest

from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings

from live_server import MODEL_NAMES, LiveServer, make_fake

KEY, ADMIN = "page-key", "page-admin"
WEATHER = ('<think>\nThe user wants the weather in Paris, so I will call the tool.\n</think>\n\n'
           'Let me check that for you.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
CODE = ('Here it is:\n```python\ndef total(xs):\n    return sum(xs)  # <b>not bold</b>\n```\n'
        'It adds the items.')
TOOLS = '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'


def chromium_path() -> str | None:
    for name in (os.environ.get("FT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser():
    """The system's Chromium under Playwright (no browser download), or a skip saying why."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the web-test extra (playwright) is not installed")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium, or set FT_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # a 401 (before the key) or 404 (/v1/memory of an engine without a plan) is the page's normal path
    expected_http = "Failed to load resource: the server responded with a status of 40"
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and expected_http not in m.text else None)
    yield pg
    ctx.close()
    assert not errors, errors


def wait_js(pg, expr: str, timeout: float = 20.0, every: float = 0.02):
    """Poll a JS expression until truthy (page.wait_for_function evaluates a string, which the
    page's Content-Security-Policy forbids; page.evaluate is not subject to it)."""
    deadline = time.monotonic() + timeout
    while not pg.evaluate(expr):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expr}")
        time.sleep(every)


def give_key(pg, key):
    pg.wait_for_selector("#key-dialog[open]", timeout=20000)
    pg.fill("#key-input", key)
    pg.click("#key-ok")


def open_page(pg, url):
    """Load the page behind --api-key: it asks for the key, then the dashboard updates."""
    pg.goto(url + "/")
    give_key(pg, KEY)
    wait_js(pg, "window.FT.dash.polls > 0", 30)


@pytest.fixture(scope="module")
def fake_page_server():
    from fake_engine import FakeEngine
    engine = FakeEngine(scripts={"weather": WEATHER, "sum of a list": CODE}, chars_per_step=2, step_delay=0.03)
    _, svc, app = make_fake(engine, api_key=KEY)
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


@pytest.mark.browser
def test_page_asks_for_the_key_and_streams_a_chat(page, fake_page_server):
    url = fake_page_server
    open_page(page, url)
    assert page.evaluate("sessionStorage.getItem('freetoken.apiKey')") == KEY
    assert page.text_content("#model-name") == MODEL_NAMES[0]
    page.click("#chat-options summary")
    page.fill("#tools", TOOLS)
    page.fill("#prompt", "what is the weather in Paris?")
    page.press("#prompt", "Enter")
    # streaming: the reply is seen part-written before it is done
    wait_js(page, """(() => { const m = document.querySelector('.msg.assistant');
        return m && m.dataset.state === 'streaming' && m.querySelector('.reasoning pre')
               && m.querySelector('.reasoning pre').textContent.length > 0; })()""", 20)
    page.wait_for_selector(".msg.assistant[data-state=done]", timeout=30000)
    msg = page.locator(".msg.assistant")
    details = msg.locator("details.reasoning")
    assert details.get_attribute("open") is None                       # folded
    assert "The user wants the weather in Paris" in details.locator("pre").text_content()
    assert msg.locator(".content").text_content().strip() == "Let me check that for you."
    assert msg.locator(".tool-name").text_content() == "get_weather"
    assert '"city": "Paris"' in msg.locator(".tool-args").text_content()
    assert "finish: tool_calls" in msg.locator(".meta").text_content()


@pytest.mark.browser
def test_code_fences_show_as_code_blocks_never_as_html(page, fake_page_server):
    open_page(page, fake_page_server)
    page.fill("#prompt", "a function for the sum of a list, please")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-state=done]", timeout=30000)
    content = page.locator(".msg.assistant .content")
    block = content.locator("pre.code")
    assert block.get_attribute("data-lang") == "python"
    assert block.locator("code").text_content() == "def total(xs):\n    return sum(xs)  # <b>not bold</b>"
    assert content.locator("b").count() == 0                        # model text is never HTML
    assert content.text_content().startswith("Here it is:") and content.text_content().endswith("It adds the items.")


@pytest.mark.browser
def test_a_wrong_key_is_asked_again(page, fake_page_server):
    page.goto(fake_page_server + "/")
    give_key(page, "wrong")
    page.wait_for_selector("#key-dialog[open]", timeout=20000)
    assert "refused" in page.text_content("#key-why")
    page.fill("#key-input", KEY)
    page.click("#key-ok")
    wait_js(page, "window.FT.dash.polls > 0", 20)


def test_page_files_are_open_but_data_needs_the_key(fake_page_server):
    url = fake_page_server
    for path in ("/", "/web/dashboard.js", "/web/style.css", "/web/favicon.svg"):
        r = httpx.get(url + path)
        assert r.status_code == 200 and "default-src 'self'" in r.headers["content-security-policy"]
    assert httpx.get(url + "/web/..%2Fapp.py").status_code == 404         # files by name only
    assert httpx.get(url + "/web/nothing.js").status_code == 404
    assert httpx.get(url + "/api/stats").status_code == 401
    assert httpx.get(url + "/api/stats", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    # the Host guard still stands in front of the page
    assert httpx.get(url + "/", headers={"Host": "evil.example"}).status_code == 403


# ---- the dashboard over a real engine ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_page_server(tiny_model_dir):
    from freetoken import LLM
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=4096, max_num_seqs=4,
              kv_cache_gib=0.05, moe_backend="hybrid", expert_cache_slots=5)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=4, max_waiting=8, max_tokens_cap=12)
    svc.loop.stats_every = 0.2
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, api_key=KEY, admin_token=ADMIN))
    srv = LiveServer(app)
    yield srv.url, llm
    srv.stop()
    llm.close()


def metrics_samples(url) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def expected(samples, name, labels, how):
    """The value an element must show, computed from /metrics as the element says."""
    def pick(n):
        return [v for lab, v in samples.get(n, []) if all(lab.get(k) == x for k, x in labels.items())
                and (labels or how == "sum" or not lab)]
    if how == "mean":
        s, c = pick(name + "_sum"), pick(name + "_count")
        return s[0] / c[0] if s and c and c[0] else None
    vals = pick(name) or pick(name + "_total")
    if not vals:
        return None
    return sum(vals) if how == "sum" else vals[0]


@pytest.mark.browser
def test_dashboard_numbers_equal_metrics(page, tiny_page_server):
    url, llm = tiny_page_server
    open_page(page, url)
    # a chat round trip through the page, then a few requests the page did not send
    page.fill("#prompt", "hello there")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-state=done]", timeout=60000)
    assert "finish: " in page.text_content(".msg.assistant .meta")
    auth = {"Authorization": f"Bearer {KEY}"}
    shared = "You are a careful assistant. " * 8
    for i in range(3):          # the same long prefix: later ones hit the prefix cache
        r = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=120, json={
            "model": MODEL_NAMES[0], "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"question {i}"}]})
        assert r.status_code == 200
    time.sleep(1.0)              # the engine thread's statistics snapshot settles (stats_every)
    page.evaluate("window.FT.dash.refresh()")
    wait_js(page, "document.querySelector('[data-metric=freetoken_requests_total]').dataset.value === '4'", 20)
    samples = metrics_samples(url)
    shown = page.eval_on_selector_all("[data-metric], [data-check]", """els => els.map(e => ({
        name: e.dataset.metric || e.dataset.check, labels: e.dataset.labels || '',
        how: e.dataset.sum ? 'sum' : e.dataset.mean ? 'mean' : 'one', value: e.dataset.value,
        text: e.textContent, check: !!e.dataset.check }))""")
    # hits/fills/CPU of both MoE layers (the speculative table's cells are checked too, below)
    assert len([s for s in shown if s["check"] and s["name"].startswith("freetoken_engine_layer_")]) == 3 * 2
    compared = 0
    for s in shown:
        labels = dict(kv.split("=") for kv in s["labels"].split(",") if kv)
        want = expected(samples, s["name"], labels, s["how"])
        if want is None:
            assert s["value"] == "", s
            continue
        assert s["value"] != "" and math.isclose(float(s["value"]), want, rel_tol=1e-9, abs_tol=1e-12), (s, want)
        assert s["text"] not in ("", "–"), s
        compared += 1
    assert compared >= 25
    tot = {k: expected(samples, f"freetoken_engine_total_{k}", {}, "one") for k in ("hits", "fills", "cpu_experts")}
    assert tot["fills"] > 0 and tot["cpu_experts"] > 0
    assert expected(samples, "freetoken_engine_prefix_hit_tokens", {}, "one") > 0
    # the charts got one point per finished request, with its prefix-cache hits
    reqs = page.evaluate("window.FT.dash.stats.requests")
    assert len(reqs) == 4 and sum(r["cached_tokens"] for r in reqs) == \
        expected(samples, "freetoken_engine_prefix_hit_tokens", {}, "one")
    # the q* split and the memory plan are drawn
    assert page.text_content("#policy") == "hybrid"
    assert page.text_content("#qstar-ratio") not in ("", "–")
    assert page.locator(".mem-bar[data-device=host] .mem-seg").count() >= 3


@pytest.mark.browser
def test_resize_control_with_the_admin_token(page, tiny_page_server):
    url, llm = tiny_page_server
    open_page(page, url)
    assert page.is_visible("#resize-form")
    gib = 3 * llm.engine.model.experts.S / 2 ** 30           # three slots
    page.fill("#resize-form input[name=expert_cache_gib]", repr(gib))
    page.click("#resize-form button[type=submit]")
    give_key(page, ADMIN)                                     # the admin token, asked separately
    wait_js(page, "document.getElementById('resize-result').textContent.startsWith('done')", 30)
    assert llm.engine.memory_sizes()["expert_cache"]["slots"] == 3
    assert page.evaluate("sessionStorage.getItem('freetoken.adminToken')") == ADMIN


def test_api_stats_is_the_snapshot_metrics_renders(tiny_page_server):
    """Without a browser: /api/stats's engine snapshot and its per-expert sums against /metrics."""
    url, _ = tiny_page_server
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=120, json={
        "model": MODEL_NAMES[0], "max_tokens": 5, "messages": [{"role": "user", "content": "stats?"}]})
    assert r.status_code == 200
    time.sleep(1.0)
    st = httpx.get(url + "/api/stats", headers=auth).json()
    samples = metrics_samples(url)
    eng = st["engine"]
    for k in ("hits", "fills", "cpu_experts"):
        assert eng["total"][k] == expected(samples, f"freetoken_engine_total_{k}", {}, "one")
        for layer, row in enumerate(eng["per_expert"][k]):
            assert sum(row) == expected(samples, f"freetoken_engine_layer_{k}", {"layer": str(layer)}, "one")
    assert eng["bandwidth"]["b_p_gbs"] == expected(samples, "freetoken_engine_bandwidth_b_p_gbs", {}, "one")
    last = st["requests"][-1]
    assert last["completion_tokens"] == r.json()["usage"]["completion_tokens"]
    assert last["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert st["admin"] is True and st["model"] == MODEL_NAMES[0]


@pytest.fixture(scope="module")
def drafting_page_server(tiny_model_dir):
    """A tiny MoE drafting with a draft model (itself: every draft right) on every step."""
    from freetoken import LLM
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=4096, max_num_seqs=4, kv_cache_gib=0.05,
              speculative="draft", draft_model=str(tiny_model_dir))
    llm.engine.spec.priced = False
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=4, max_waiting=8, max_tokens_cap=24)
    svc.loop.stats_every = 0.2
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, api_key=KEY))
    srv = LiveServer(app)
    yield srv.url, llm
    srv.stop()
    llm.close()


@pytest.mark.browser
def test_speculative_table_equals_metrics(page, drafting_page_server):
    """Proposed / accepted / mean accepted length per drafter: each cell the /metrics series it
    names, the ratio and the draft model's line drawn."""
    url, _ = drafting_page_server
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=120, json={
        "model": MODEL_NAMES[0], "max_tokens": 20, "temperature": 0, "messages": [{"role": "user", "content": "go"}]})
    assert r.status_code == 200
    time.sleep(1.0)
    open_page(page, url)
    wait_js(page, "!document.getElementById('spec-table').hidden", 20)
    samples = metrics_samples(url)
    cells = page.eval_on_selector_all("#spec-table [data-check]", """els => els.map(e => ({
        name: e.dataset.check, value: e.dataset.value }))""")
    assert {c["name"].rsplit("draft_", 1)[-1] for c in cells} == {
        "drafts", "proposed_tokens", "accepted_tokens", "mean_accepted_length"}
    for c in cells:
        want = expected(samples, c["name"], {}, "one")
        assert want is not None and math.isclose(float(c["value"]), want, rel_tol=1e-9), (c, want)
    row = page.eval_on_selector_all("#spec-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert row[0][0] == "draft" and float(row[0][4]) == 1.0            # itself as its draft: all accepted
    assert "draft model:" in page.text_content("#spec-extra")
    assert "(draft," in page.text_content("#spec-mode")
