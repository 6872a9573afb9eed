"""Session readers: the real agent-session data rebuilt by each framework's rule
(../shared/data/agent-sessions/SOURCES.md), and the held-back formats from their description."""
from __future__ import annotations

import json

import pytest
from helpers import SHARED_DATA
from session_fixtures import SYSTEM, TASK, mini_swe_agent, mitm_dump, swe_agent_11

from freetoken.sim.sessions import SessionError, read_sessions

DATA = SHARED_DATA / "agent-sessions"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"agent sessions not found at {DATA}")


@needs_data
def test_swe_agent_10_requests_follow_last_n_observations():
    # request counts from the SOURCES.md file table
    expected = {"psf__requests-2931": 15, "sympy__sympy-21612": 14, "django__django-11815": 7,
                "pylint-dev__pylint-4970": 76}
    sessions = {s.name: s for s in read_sessions([DATA / "swe-agent-1.0.1_selfhosted-lastn5"])}
    assert len(sessions) == 11
    for name, n in expected.items():
        assert len(sessions[name].requests) == n
    s = sessions["pylint-dev__pylint-4970"]
    raw = json.loads((DATA / "swe-agent-1.0.1_selfhosted-lastn5" / "pylint-dev__pylint-4970.traj").read_text())
    assert [m["content"] for m in s.requests[0].messages] == [m["content"] for m in raw["history"][:2]]
    elided = 0
    for i in range(1, len(s.requests)):
        prev, cur = s.requests[i - 1], s.requests[i]
        # the response to request i-1 is the assistant message appended in request i
        assert cur.messages[len(prev.messages)]["content"] == prev.response["content"]
        elided += any(m["content"].startswith("Old environment output:") for m in cur.messages)
        # observation 0 (the instance prompt) is never elided
        assert cur.messages[1]["content"] == s.requests[0].messages[1]["content"]
    assert elided > 50      # from request 6 on, old observations are replaced


@needs_data
def test_tau_bench_and_openhands_are_append_only():
    tau = read_sessions([DATA / "tau-bench_gpt-4o-airline"])
    assert len(tau) == 200
    oh = read_sessions([DATA / "openhands-0.x_llama-4-maverick_events"])
    assert [s.name for s in oh] == ["ponylang__ponyc-4595", "ponylang__ponyc-4593", "ponylang__ponyc-4588"]
    assert oh[0].requests[0].tools and oh[0].requests[0].messages[0]["role"] == "system"
    for s in tau[:20] + oh:
        for prev, cur in zip(s.requests, s.requests[1:]):
            n = len(prev.messages)
            assert cur.messages[:n] == prev.messages
            assert cur.messages[n]["role"] == "assistant"
            assert cur.messages[n].get("tool_calls") == prev.response.get("tool_calls")
    calls = [m for s in oh for r in s.requests for m in r.messages if m["role"] == "tool"]
    assert calls and all(m["tool_call_id"].startswith("toolu_") for m in calls)


def test_mini_swe_agent(tmp_path):
    [s] = read_sessions([mini_swe_agent(tmp_path / "demo.traj.json")])
    assert s.format == "mini-swe-agent" and s.name == "demo-1" and len(s.requests) == 2
    assert [m["role"] for m in s.requests[1].messages] == ["system", "user", "assistant", "user"]
    # reasoning belongs to the response, never to a later request
    assert s.requests[0].response["reasoning_content"] == "list files first"
    assert "reasoning_content" not in s.requests[1].messages[2]


def test_swe_agent_11_query(tmp_path):
    [s] = read_sessions([swe_agent_11(tmp_path / "x.traj")])
    assert s.format == "swe-agent-1.1" and len(s.requests) == 2       # autosubmit [{}] skipped
    r1 = s.requests[1]
    assert r1.messages[1]["content"] == TASK                          # cache_control dropped, text kept
    assert r1.messages[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": {"command": "ls"}}
    assert r1.messages[3] == {"role": "tool", "content": "a.py b.py", "tool_call_id": "toolu_1"}
    assert s.requests[0].response["tool_calls"][0]["id"] == "toolu_1"  # from the next query
    assert s.requests[1].response["content"] == "Done."


def test_mitm_dump(tmp_path):
    [s] = read_sessions([mitm_dump(tmp_path / "cap.mitm")])
    assert s.format == "mitmproxy" and len(s.requests) == 3           # GET /v1/models skipped
    assert s.requests[1].messages[0] == {"role": "system", "content": SYSTEM}
    assert s.requests[1].response == {"role": "assistant", "content": "<function=ls>",
                                      "reasoning_content": "think "}
    assert s.requests[2].response["content"] == "done"


def test_bad_input_names_the_file(tmp_path):
    with pytest.raises(SessionError, match="nope.traj: no such file"):
        read_sessions([tmp_path / "nope.traj"])
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(SessionError, match="bad.json: unknown session format"):
        read_sessions([bad])
    bad.write_text('{"trajectory": [{"action": "x"}]}')
    with pytest.raises(SessionError, match=r"bad.json: trajectory\[\*\]: expected 'messages'"):
        read_sessions([bad])
    m = tmp_path / "bad.mitm"
    m.write_bytes(b"12:abc")
    with pytest.raises(SessionError, match="bad.mitm: flow 0: not a mitmproxy"):
        read_sessions([m])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SessionError, match="no session files"):
        read_sessions([empty])
