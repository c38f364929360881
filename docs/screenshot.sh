#!/usr/bin/env bash
# Screenshot of the app for the README: starts streamlit on localhost, waits until it answers,
# opens the seed story at a step (side by side) in headless chromium, saves docs/app.png.
#   apt-get install -y chromium   # once (Debian)
#   bash docs/screenshot.sh [step] [port] [--play SECONDS] [--view what-if] [--size W,H]
#   OUT=/tmp/whatif.png bash docs/screenshot.sh 0 8599 --view what-if   # another file (default docs/app.png)
set -euo pipefail
cd "$(dirname "$0")/.."
step="${1:-300}"
port="${2:-8599}"

began=$(date +%s%N)
streamlit run app.py --server.headless true --server.address localhost --server.port "$port" \
  --browser.gatherUsageStats false >/tmp/minillm-streamlit.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 120); do  # the health endpoint answers once the server is up
  curl -sf "http://localhost:$port/_stcore/health" >/dev/null && break
  sleep 0.2
done
echo "server answering after $(( ($(date +%s%N) - began) / 1000000 )) ms"

out="${OUT:-docs/app.png}"
python docs/screenshot.py "http://localhost:$port/?step=$step" "$out" "${@:3}"
echo "wrote $out"
