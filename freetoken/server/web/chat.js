// The chat: /v1/chat/completions streamed (SSE over fetch), reasoning in a folded <details>,
// tool calls as their own blocks. Model text only ever goes in through textContent.
"use strict";

(() => {
  const history = [];            // OpenAI messages sent with the next turn
  let controller = null;         // the running request's AbortController

  const $ = (id) => document.getElementById(id);

  function bubble(role) {
    const b = FT.el("div", "msg " + role);
    b.append(FT.el("div", "role", role));
    $("messages").append(b);
    return b;
  }

  // Model text with its ``` fences shown as code blocks (the language tag as a label); every
  // piece goes in through textContent, so nothing the model writes is ever parsed as HTML.
  function renderText(el, text) {
    el.replaceChildren();
    const parts = text.split(/^```/m);
    parts.forEach((part, i) => {
      if (i % 2 === 0) { if (part) el.append(document.createTextNode(part.replace(/^\n/, ""))); return; }
      const nl = part.indexOf("\n");
      const lang = nl < 0 ? "" : part.slice(0, nl).trim();
      const pre = FT.el("pre", "code");
      if (lang) pre.dataset.lang = lang;
      pre.append(FT.el("code", null, nl < 0 ? "" : part.slice(nl + 1).replace(/\n$/, "")));
      el.append(pre);
    });
  }

  function scroll() { const m = $("messages"); m.scrollTop = m.scrollHeight; }

  // One assistant reply as it streams: parts are created when their first delta arrives.
  class Reply {
    constructor() {
      this.box = bubble("assistant");
      this.box.dataset.state = "streaming";
      this.text = ""; this.reasoning = ""; this.calls = [];
    }
    addReasoning(t) {
      if (!this.reasoningEl) {
        const d = FT.el("details", "reasoning");       // folded by default
        d.append(FT.el("summary", null, "Reasoning"));
        this.reasoningEl = FT.el("pre");
        d.append(this.reasoningEl);
        this.box.append(d);
      }
      this.reasoning += t;
      this.reasoningEl.textContent = this.reasoning;
    }
    addText(t) {
      if (!this.textEl) { this.textEl = FT.el("div", "content"); this.box.append(this.textEl); }
      this.text += t;
      renderText(this.textEl, this.text);
    }
    addToolCall(d) {
      let c = this.calls[d.index];
      if (!c) {
        const el = FT.el("div", "tool-call");
        const name = FT.el("span", "tool-name");
        const args = FT.el("pre", "tool-args");
        el.append(FT.el("span", "tool-label", "tool call "), name, args);
        this.box.append(el);
        c = this.calls[d.index] = { id: d.id, name: "", args: "", nameEl: name, argsEl: args };
      }
      const f = d.function || {};
      if (f.name) { c.name += f.name; c.nameEl.textContent = c.name; }
      if (f.arguments) { c.args += f.arguments; c.argsEl.textContent = c.args; }
      if (d.id) c.id = d.id;
    }
    finish(reason, usage, error) {
      this.box.dataset.state = error ? "error" : "done";
      const parts = [];
      if (reason) parts.push("finish: " + reason);
      if (usage) {
        parts.push(`${usage.prompt_tokens} prompt (${(usage.prompt_tokens_details || {}).cached_tokens || 0} cached) + ${usage.completion_tokens} tokens`);
      }
      if (error) this.box.append(FT.el("div", "error", error));
      this.box.append(FT.el("div", "meta", parts.join(" · ")));
    }
    message() {
      const m = { role: "assistant", content: this.text };
      if (this.reasoning) m.reasoning_content = this.reasoning;
      const calls = this.calls.filter(Boolean);
      if (calls.length) {
        m.tool_calls = calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.args } }));
      }
      return m;
    }
  }

  // SSE "data:" payloads from a fetch body, one parsed object (or "[DONE]") at a time.
  async function* events(body) {
    const reader = body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;               // a keep-alive comment
        yield data === "[DONE]" ? data : JSON.parse(data);
      }
    }
  }

  function requestBody() {
    const msgs = [];
    const system = $("system").value.trim();
    if (system) msgs.push({ role: "system", content: system });
    const body = { model: FT.model, messages: msgs.concat(history), stream: true,
                   stream_options: { include_usage: true } };
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    const temp = parseFloat($("temperature").value);
    if (!Number.isNaN(temp)) body.temperature = temp;
    const tools = $("tools").value.trim();
    if (tools) body.tools = JSON.parse(tools);     // a SyntaxError is shown to the user
    return body;
  }

  async function send(text) {
    const userBox = bubble("user");
    userBox.append(FT.el("div", "content", text));
    history.push({ role: "user", content: text });
    const reply = new Reply();
    scroll();
    controller = new AbortController();
    $("send").disabled = true; $("stop").disabled = false;
    let reason = null, usage = null, error = null;
    try {
      const r = await FT.postJSON("/v1/chat/completions", requestBody(), "api", controller.signal);
      if (!r.ok) {
        const b = await r.json().catch(() => ({}));
        throw new Error(`${r.status}: ${(b.error && b.error.message) || r.statusText}`);
      }
      for await (const ev of events(r.body)) {
        if (ev === "[DONE]") break;
        if (ev.error) { error = ev.error.message || JSON.stringify(ev.error); break; }
        if (ev.usage) usage = ev.usage;
        for (const ch of ev.choices || []) {
          const d = ch.delta || {};
          if (d.reasoning_content) reply.addReasoning(d.reasoning_content);
          if (d.content) reply.addText(d.content);
          for (const tc of d.tool_calls || []) reply.addToolCall(tc);
          if (ch.finish_reason) reason = ch.finish_reason;
        }
        scroll();
      }
    } catch (e) {
      error = e.name === "AbortError" ? "stopped" : String(e.message || e);
    } finally {
      controller = null;
      $("send").disabled = false; $("stop").disabled = true;
    }
    reply.finish(reason, usage, error);
    if (reply.text || reply.calls.length) history.push(reply.message());
    else history.pop();                    // nothing came back: the turn is not kept
    scroll();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const prompt = $("prompt");
    $("chat-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = prompt.value.trim();
      if (!text || controller) return;
      prompt.value = "";
      send(text);
    });
    prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("chat-form").requestSubmit(); }
    });
    $("stop").onclick = () => controller && controller.abort();
    $("clear").onclick = () => { history.length = 0; $("messages").textContent = ""; };
  });
})();
