#!/usr/bin/env bash
# Claude Code, OpenCode and OpenClaw against a FreeToken server, run inside a fresh network
# namespace that has only loopback: the agents and the server can reach 127.0.0.1 and nothing
# else (so no agent can fall back to a cloud endpoint). Not part of CI. Needs root (unshare -n),
# and the npm registry for the install step (node 24 and pinned client versions, installed
# under $WORK: the machine's own node and npm are not used to run anything).
#
# Usage: bench/agents_e2e.sh [serve args...]   one "say hi" turn each, e.g. --model /models/qwen3
#        bench/agents_e2e.sh --scripted        a scripted "model" (bench/scripted_server.py) that
#            calls each agent's read tool, then answers "All done: ...": the tool round trip
#        bench/agents_e2e.sh --long            a long unattended session per agent on the scripted
#            server: ROUNDS tool-call rounds whose history outgrows the window, so the agent must
#            compact and go on; Claude Code also runs two sub-agents at once. Prints per request:
#            what it was, prompt tokens, cached tokens, TTFT.
#        MODEL=DIR bench/agents_e2e.sh --free   a long session per agent on `freetoken serve --model
#            DIR` whose replies are the model's own (a random-weight tiny model writes noise): the
#            bench sends ROUNDS user messages of ~window/9 tokens each through the agent's continue
#            mode (claude -p --continue, opencode run --continue, openclaw agent --local
#            --session-id), so the history crosses the window and the agent must compact. Prints
#            per round and request: prompt tokens, cached tokens, TTFT; checks no round errored out.
# Env:   WORK (scratch dir, default .cache/agents-e2e), PORT (default 8765),
#        AGENTS (default "claude opencode openclaw"), TURN_TIMEOUT (seconds, default 900),
#        ROUNDS (13), FILE_BYTES (6000), WINDOW_claude/_opencode/_openclaw (100000/50000/100000)
#        CAP (--free only: the server's --max-tokens-cap, default 512), MSG_BYTES (--free only:
#            bytes of text per user message, default 0.4 x window, about window/9 tokens)
#        MODEL (--long only: a checkpoint dir whose real engine runs every request, its output
#        forced to the script: real prefill, KV, timings), NODE_VERSION (24.22.3), CLAUDE_CODE_VERSION (2.1.332), OPENCODE_VERSION (1.18.33),
#        OPENCLAW_VERSION (2026.9.6)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$ROOT/.cache/agents-e2e}"
PORT="${PORT:-8765}"
AGENTS="${AGENTS:-claude opencode openclaw}"
TURN_TIMEOUT="${TURN_TIMEOUT:-900}"
NODE_VERSION="${NODE_VERSION:-24.22.3}"
PINNED="@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-2.1.332} opencode-ai@${OPENCODE_VERSION:-1.18.33} openclaw@${OPENCLAW_VERSION:-2026.9.6}"
PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"    # this checkout's freetoken, not another
NODE_DIR="$WORK/node-$NODE_VERSION"

if [[ -z "${IN_NETNS:-}" ]]; then
  [[ -x "$PY" ]] || { echo "no $PY: run ./ft first to build the virtualenv"; exit 1; }
  mkdir -p "$WORK/clients"
  # 1. node 24 from the npm registry (OpenClaw needs >=24.16; a machine's node 20 makes npm
  #    pick a placeholder openclaw and an old Claude Code). Outside the namespace: needs the registry.
  if [[ ! -x "$NODE_DIR/bin/node" ]]; then
    arch=$(uname -m); case $arch in x86_64) arch=x64;; aarch64) arch=arm64;; esac
    pkg="node-linux-$arch"
    echo "== installing node $NODE_VERSION ($pkg from registry.npmjs.org)"
    mkdir -p "$NODE_DIR"
    curl -fsSL "https://registry.npmjs.org/$pkg/-/$pkg-$NODE_VERSION.tgz" \
      | tar -xz -C "$NODE_DIR" --strip-components=1
  fi
  export PATH="$NODE_DIR/bin:$PATH"
  echo "== node $(node --version)"
  # 2. the agents, at pinned versions, reinstalled when a pin changes
  if [[ "$(cat "$WORK/clients/.pinned" 2>/dev/null)" != "$PINNED" ]]; then
    command -v npm >/dev/null || { echo "npm is needed to install the agents"; exit 1; }
    echo "== installing $PINNED (npm)"
    (cd "$WORK/clients" && { [[ -f package.json ]] || npm init -y >/dev/null; } &&
       npm install --no-fund --no-audit $PINNED)
    echo "$PINNED" > "$WORK/clients/.pinned"
  fi
  # 3. Everything else runs in a namespace with loopback only.
  exec env IN_NETNS=1 PATH="$PATH" unshare -n "$0" "$@"
fi

ip link set lo up
export PATH="$NODE_DIR/bin:$WORK/clients/node_modules/.bin:$PATH"
for c in claude opencode openclaw; do printf '%-9s %s\n' "$c" "$($c --version 2>&1 | head -1)"; done
LOG="$WORK/logs"; rm -rf "$LOG"; mkdir -p "$LOG"
URL="http://127.0.0.1:$PORT"
MODE=turn
case "${1:-}" in --scripted) MODE=scripted; shift;; --long) MODE=long; shift;; --free) MODE=free; shift;; esac
[[ $MODE != free || -n "${MODEL:-}" ]] || { echo "--free needs MODEL=DIR (a checkpoint)"; exit 1; }

SRV=""
stop_server() { [[ -n "$SRV" ]] && { kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null || true; }; SRV=""; }
trap stop_server EXIT
start_server() {   # start_server LOGFILE CMD...
  local log=$1; shift
  echo "== starting: ${*#$ROOT/}"
  "$@" > "$log" 2>&1 &
  SRV=$!
  for _ in $(seq 600); do
    grep -q "^READY " "$log" && return 0
    kill -0 "$SRV" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.5
  done
  echo "server did not become ready"; tail "$log"; exit 1
}

TASK="Follow the instructions you give yourself; read each file you ask for, and stop when you say you are done."
declare -A ARGS=(
  [claude]='-p "say hi"'
  [opencode]='run "say hi"'
  [openclaw]='agent exec "say hi"'
)
if [[ $MODE == long ]]; then
  ARGS=([claude]="-p \"$TASK\" --allowedTools Read Agent" [opencode]="run \"$TASK\""
        [openclaw]="agent exec --timeout $TURN_TIMEOUT \"$TASK\"")   # its own deadline: 600 s
fi
ROUNDS="${ROUNDS:-13}"
declare -A WINDOW=([claude]="${WINDOW_claude:-100000}" [opencode]="${WINDOW_opencode:-50000}"
                   [openclaw]="${WINDOW_openclaw:-100000}")
declare -A RC

if [[ $MODE == scripted ]]; then
  start_server "$LOG/server.log" "$PY" "$ROOT/bench/scripted_server.py" --port "$PORT" --workspace "$WORK/ws"
elif [[ $MODE == turn ]]; then
  start_server "$LOG/server.log" "$PY" -m freetoken.cli serve --port "$PORT" --log-level info "$@"
fi

# --free: one round = one agent run in its continue mode with a new user message.
free_args() {   # free_args AGENT ROUND MESSAGE: the agent's arguments, in the array FREE_ARGS
  case $1 in
    claude)   FREE_ARGS=(-p); [[ $2 == 1 ]] || FREE_ARGS+=(--continue); FREE_ARGS+=("$3");;
    opencode) FREE_ARGS=(run); [[ $2 == 1 ]] || FREE_ARGS+=(--continue); FREE_ARGS+=("$3");;
    openclaw) FREE_ARGS=(agent --local --session-id bench-long --message "$3");;
  esac
}
free_message() {   # free_message ROUND BYTES
  local unit="round $1 notes: the quick brown fox jumps over the lazy dog while a model routes every token " text=""
  while (( ${#text} < $2 )); do text+="$unit"; done
  printf 'Round %s of %s of a long session. Reply in one line. Notes for this round: %s' "$1" "$ROUNDS" "${text:0:$2}"
}
free_session() {   # free_session AGENT WS SERVER_LOG
  local agent=$1 ws=$2 slog=$3 k rc t0 before after
  : > "$LOG/$agent.rounds"
  for k in $(seq "$ROUNDS"); do
    free_args "$agent" "$k" "$(free_message "$k" "${MSG_BYTES:-$(( ${WINDOW[$agent]} * 2 / 5 ))}")"
    before=$(grep -c "req=.* prompt=" "$slog" || true); t0=$(date +%s); rc=0
    (cd "$ws" && timeout "$TURN_TIMEOUT" "$PY" -m freetoken.cli launch "$agent" --server "$URL" \
        --config-dir "$WORK/cfg-$agent" -- "${FREE_ARGS[@]}") >> "$LOG/$agent.stdout" 2>> "$LOG/$agent.stderr" || rc=$?
    after=$(grep -c "req=.* prompt=" "$slog" || true)
    echo "$k $rc $before $after $(( $(date +%s) - t0 ))" >> "$LOG/$agent.rounds"
    echo "   round $k: rc=$rc, $((after - before)) requests, $(( $(date +%s) - t0 ))s"
    [[ $rc == 0 ]] || tail -c 400 "$LOG/$agent.stderr" | sed 's/^/     /'
  done
  "$PY" "$ROOT/bench/agent_free_rounds.py" "$slog" "$LOG/$agent.rounds" || return 1
}

for agent in $AGENTS; do
  ws="$WORK/ws"; slog="$LOG/server.log"
  if [[ $MODE == free ]]; then
    ws="$WORK/ws-$agent"; slog="$LOG/server-$agent.log"; rm -rf "$ws"
    export HOME="$WORK/home-$agent"; rm -rf "$HOME"; mkdir -p "$HOME" "$ws"
    start_server "$slog" "$PY" -m freetoken.cli serve --model "$MODEL" --port "$PORT" --log-level info \
      --served-model-name freetoken-demo --max-model-len "${WINDOW[$agent]}" --max-tokens-cap "${CAP:-512}"
    echo "== $agent: free-running long session, $ROUNDS rounds, window ${WINDOW[$agent]} tokens, replies <= ${CAP:-512} tokens"
    t0=$(date +%s)
    RC[$agent]=0; free_session "$agent" "$ws" "$slog" || RC[$agent]=$?
    stop_server
    echo "   rc=${RC[$agent]}  requests served: $(grep -c "req=.* prompt=" "$slog" || true)  wall: $(( $(date +%s) - t0 ))s"
    continue
  fi
  if [[ $MODE == long ]]; then
    ws="$WORK/ws-$agent"; slog="$LOG/server-$agent.log"; rm -rf "$ws"
    sub=(); [[ $agent == claude ]] && sub=(--sub-at 3)
    [[ -n "${MODEL:-}" ]] && sub+=(--model "$MODEL")
    start_server "$slog" "$PY" "$ROOT/bench/scripted_server.py" --port "$PORT" --workspace "$ws" \
      --rounds "$ROUNDS" --file-bytes "${FILE_BYTES:-6000}" --max-model-len "${WINDOW[$agent]}" "${sub[@]}"
    echo "== $agent: long session, $ROUNDS rounds, window ${WINDOW[$agent]} tokens"
  else
    echo "== $agent: one turn"
  fi
  export HOME="$WORK/home-$agent"; rm -rf "$HOME"; mkdir -p "$HOME" "$ws"
  before=$(grep -c "req=.* prompt=" "$slog" || true)
  t0=$(date +%s)
  set +e
  (cd "$ws" && eval timeout "$TURN_TIMEOUT" "$PY" -m freetoken.cli launch "$agent" --server "$URL" \
      --config-dir "$WORK/cfg-$agent" -- "${ARGS[$agent]}") > "$LOG/$agent.stdout" 2> "$LOG/$agent.stderr"
  RC[$agent]=$?
  set -e
  secs=$(( $(date +%s) - t0 ))
  if [[ $MODE == scripted && ${RC[$agent]} == 0 ]] && ! grep -q "All done:.*scratch workspace" "$LOG/$agent.stdout"; then
    echo "   the agent did not report the tool result"; RC[$agent]=99
  fi
  if [[ $MODE == long ]]; then
    "$PY" "$ROOT/bench/agent_rounds.py" "$slog" --rounds "$ROUNDS" \
      $([[ $agent == claude ]] && echo --subagents) --stdout "$LOG/$agent.stdout" || { [[ ${RC[$agent]} == 0 ]] && RC[$agent]=98; }
    stop_server
  fi
  after=$(grep -c "req=.* prompt=" "$slog" || true)
  echo "   rc=${RC[$agent]}  requests served: $((after - before))  wall: ${secs}s"
  echo "   stdout: $(tail -c 300 "$LOG/$agent.stdout" | tr '\n' ' ')"
  [[ ${RC[$agent]} == 0 ]] || echo "   stderr: $(tail -c 600 "$LOG/$agent.stderr" | tr '\n' ' ')"
done

echo "== summary (logs in $LOG)"
fail=0
for agent in $AGENTS; do
  printf '%-9s %s\n' "$agent" "$([[ ${RC[$agent]} == 0 ]] && echo ok || echo "FAILED (rc=${RC[$agent]})")"
  [[ ${RC[$agent]} == 0 ]] || fail=1
done
[[ $MODE == long || $MODE == free ]] || grep "req=" "$LOG/server.log" | tail -n 20
exit $fail
