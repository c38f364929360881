#!/usr/bin/env bash
# Screenshots of the app for the README: starts streamlit on localhost, waits until it answers, opens the app in
# headless chromium (docs/screenshot.py), saves PNGs.
#   apt-get install -y chromium   # once (Debian)
#   bash docs/screenshot.sh --all             # the README's set: docs/app.png, and the presenter view of the step
#                                             # player and the what-if tab at 1280x720 and 1920x1080 (docs/present-*)
#   bash docs/screenshot.sh [step] [port] [--play SECONDS] [--view what-if] [--size W,H] [--present] [--check-labels]
#   OUT=/tmp/whatif.png bash docs/screenshot.sh 0 8599 --view what-if   # another file (default docs/app.png)
set -euo pipefail
cd "$(dirname "$0")/.."
all=false
if [[ "${1:-}" == "--all" ]]; then
  all=true
  shift
fi
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

if $all; then
  python docs/screenshot.py "http://localhost:$port/?step=$step" docs/app.png
  for size in 1280x720 1920x1080; do
    python docs/screenshot.py "http://localhost:$port/?step=$step" "docs/present-step-player-$size.png" \
      --present --size "${size/x/,}" --check-labels
    python docs/screenshot.py "http://localhost:$port/" "docs/present-what-if-$size.png" \
      --present --view what-if --size "${size/x/,}" --check-labels
  done
  python docs/screenshot.py "http://localhost:$port/?step=14&speculate=4" docs/app-speculation.png --present \
    --size 1280,1500  # the chat windows below the charts: each step's kept guesses underlined
  ls -l docs/app.png docs/app-speculation.png docs/present-*.png
  exit
fi
out="${OUT:-docs/app.png}"
python docs/screenshot.py "http://localhost:$port/?step=$step" "$out" "${@:3}"
echo "wrote $out"
