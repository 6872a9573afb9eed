"""bench/agent_free_rounds.py reads a free-running session (bench/agents_e2e.sh --free) from
the server's request log: rounds, compactions seen as a shorter history, cache reuse."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "agent_free_rounds.py"


def line(i, prompt, cached, finish="stop"):
    return (f"2026-11-30 13:09:17,004 INFO freetoken.server: req=messages-{i}-x messages prompt={prompt} "
            f"cached={cached} completion=12 ttft=1.500s decode=6.3 tok/s finish={finish}")


def run(tmp_path, log_lines, rounds):
    (tmp_path / "server.log").write_text("\n".join(log_lines) + "\n")
    (tmp_path / "rounds").write_text("".join(f"{k} {rc} {a} {b} 10\n" for k, rc, a, b in rounds))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "server.log"), str(tmp_path / "rounds")],
                          capture_output=True, text=True)


SESSION = [line(0, 1000, 0), line(1, 2000, 1000), line(2, 3000, 2000),
           line(3, 3100, 3000),                      # round 4: the compaction request ...
           "INFO freetoken.server: POST /v1/messages -> 400 prompt is too long: 3300 tokens > 3199 maximum",
           line(4, 1500, 800),                       # ... and the shorter conversation after it
           line(5, 2500, 1500)]


def test_a_session_that_compacts_and_reuses_the_cache_passes(tmp_path):
    r = run(tmp_path, SESSION, [(1, 0, 0, 1), (2, 0, 1, 2), (3, 0, 2, 3), (4, 0, 3, 5), (5, 0, 5, 6)])
    assert r.returncode == 0, r.stdout
    assert "history shrank 3000 -> 1500: compacted" in r.stdout
    assert "compacted and went on (1x; 1 overflow replies)" in r.stdout
    assert "prefix cache served the history (2/2 rounds >= 90%)" in r.stdout


def test_an_agent_error_fails_the_run(tmp_path):
    r = run(tmp_path, SESSION, [(1, 0, 0, 1), (2, 0, 1, 2), (3, 1, 2, 3), (4, 0, 3, 5), (5, 0, 5, 6)])
    assert r.returncode == 1 and "FAIL all 5 rounds ran without the agent erroring out (failed: [3])" in r.stdout


def test_no_compaction_or_a_cold_history_fails(tmp_path):
    lines = [line(0, 1000, 0), line(1, 2000, 0), line(2, 3000, 2000)]
    r = run(tmp_path, lines, [(1, 0, 0, 1), (2, 0, 1, 2), (3, 0, 2, 3)])
    assert r.returncode == 1
    assert "FAIL compacted and went on (0x" in r.stdout
    assert "FAIL prefix cache served the history (1/2 rounds" in r.stdout
