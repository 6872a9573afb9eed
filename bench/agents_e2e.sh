#!/usr/bin/env bash
# One non-interactive turn of Claude Code, OpenCode and OpenClaw against `freetoken serve`,
# run inside a fresh network namespace that has only loopback: the agents and the server
# can reach 127.0.0.1 and nothing else (so no agent can fall back to a cloud endpoint).
# Not part of CI. Needs root (unshare -n) and the npm registry for the install step.
#
# Usage: bench/agents_e2e.sh [serve args...]      e.g. bench/agents_e2e.sh --model /models/qwen3
#        bench/agents_e2e.sh --scripted           a scripted "model" (bench/scripted_server.py) that
#            calls each agent's read tool, then answers "All done: ...": checks the whole
#            tool round trip (our tool call -> the agent runs it -> the result comes back)
# Env:   WORK (scratch dir, default .cache/agents-e2e), PORT (default 8765),
#        AGENTS (default "claude opencode openclaw"), TURN_TIMEOUT (seconds, default 600)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$ROOT/.cache/agents-e2e}"
PORT="${PORT:-8765}"
AGENTS="${AGENTS:-claude opencode openclaw}"
TURN_TIMEOUT="${TURN_TIMEOUT:-600}"
FT="$ROOT/.venv/bin/freetoken"

if [[ -z "${IN_NETNS:-}" ]]; then
  mkdir -p "$WORK/clients" "$WORK/node24"
  # 1. Install the agents (outside the namespace: this needs the registry).
  if [[ ! -x "$WORK/clients/node_modules/.bin/claude" || ! -x "$WORK/clients/node_modules/.bin/openclaw" ]]; then
    echo "== installing @anthropic-ai/claude-code opencode-ai openclaw (npm)"
    (cd "$WORK/clients" && [[ -f package.json ]] || (cd "$WORK/clients" && npm init -y >/dev/null))
    npm install --prefix "$WORK/clients" --no-fund --no-audit @anthropic-ai/claude-code opencode-ai openclaw
  fi
  # OpenClaw needs node >= 24.16; npm's `node` package ships that binary.
  if [[ ! -d "$WORK/node24/node_modules/node" ]]; then
    npm install --prefix "$WORK/node24" --no-fund --no-audit node@24
  fi
  [[ -x "$FT" ]] || { echo "no $FT: run ./ft first to build the virtualenv"; exit 1; }
  # 2. Everything else runs in a namespace with loopback only.
  exec env IN_NETNS=1 unshare -n "$0" "$@"
fi

ip link set lo up
NODE_BIN="$(dirname "$(find "$WORK/node24/node_modules" -path '*/bin/node' -type f | head -1)")"
export PATH="$NODE_BIN:$WORK/clients/node_modules/.bin:$PATH"
LOG="$WORK/logs"; rm -rf "$LOG"; mkdir -p "$LOG"
URL="http://127.0.0.1:$PORT"

SCRIPTED=""
if [[ "${1:-}" == "--scripted" ]]; then
  SCRIPTED=1; shift
  echo "== starting: bench/scripted_server.py --port $PORT"
  "$ROOT/.venv/bin/python" "$ROOT/bench/scripted_server.py" --port "$PORT" --workspace "$WORK/ws" \
    > "$LOG/server.log" 2>&1 &
else
  echo "== starting: freetoken serve --port $PORT $*"
  "$FT" serve --port "$PORT" --log-level info "$@" > "$LOG/server.log" 2>&1 &
fi
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "^READY " "$LOG/server.log" && break
  kill -0 $SRV 2>/dev/null || { cat "$LOG/server.log"; exit 1; }
  sleep 0.5
done
grep -q "^READY " "$LOG/server.log" || { echo "server did not become ready"; tail "$LOG/server.log"; exit 1; }

declare -A ARGS=(
  [claude]='-p "say hi"'
  [opencode]='run "say hi"'
  [openclaw]='agent exec "say hi"'
)
declare -A RC
mkdir -p "$WORK/ws"
for agent in $AGENTS; do
  echo "== $agent: one turn"
  export HOME="$WORK/home-$agent"; mkdir -p "$HOME"
  before=$(grep -c "^.*req=" "$LOG/server.log" || true)
  set +e
  (cd "$WORK/ws" && eval timeout "$TURN_TIMEOUT" "$FT" launch "$agent" --server "$URL" \
      --config-dir "$WORK/cfg" -- "${ARGS[$agent]}") > "$LOG/$agent.stdout" 2> "$LOG/$agent.stderr"
  RC[$agent]=$?
  set -e
  if [[ -n "$SCRIPTED" && ${RC[$agent]} == 0 ]] && ! grep -q "All done:.*scratch workspace" "$LOG/$agent.stdout"; then
    echo "   the agent did not report the tool result"; RC[$agent]=99
  fi
  after=$(grep -c "^.*req=" "$LOG/server.log" || true)
  echo "   rc=${RC[$agent]}  requests served: $((after - before))"
  echo "   stdout: $(head -c 300 "$LOG/$agent.stdout" | tr '\n' ' ')"
  [[ ${RC[$agent]} == 0 ]] || echo "   stderr: $(tail -c 600 "$LOG/$agent.stderr" | tr '\n' ' ')"
done

echo "== summary (logs in $LOG)"
fail=0
for agent in $AGENTS; do
  printf '%-9s %s\n' "$agent" "$([[ ${RC[$agent]} == 0 ]] && echo ok || echo "FAILED (rc=${RC[$agent]})")"
  [[ ${RC[$agent]} == 0 ]] || fail=1
done
grep "req=" "$LOG/server.log" | tail -n 20
exit $fail
