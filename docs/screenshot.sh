#!/usr/bin/env bash
# Screenshots of the app for the README: starts streamlit on localhost, waits until it answers, opens the app in
# headless chromium (docs/screenshot.py), saves PNGs, and checks each as it goes (labels cut, lettering too small,
# the step player's first screen): a check that fails stops the script.
#   apt-get install -y chromium   # once (Debian)
#   bash docs/screenshot.sh --all             # the README's set: docs/app.png; the presenter view of the step player,
#                                             # what-if and live at 1280x720 (and the first two at 1920x1080,
#                                             # docs/present-*), and of the step player's fleets (two replicas,
#                                             # prefill + decode); the normal view of each at 1280x720 (docs/app-*)
#   bash docs/screenshot.sh [step] [port] [--play SECONDS] [--view what-if] [--size W,H] [--present] [--check-labels]
#   OUT=/tmp/whatif.png bash docs/screenshot.sh 0 8599 --view what-if   # another file (default docs/app.png)
# The live shots start `python -m minillm serve` on port+2 and send it `python -m minillm load` meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
all=false
if [[ "${1:-}" == "--all" ]]; then
  all=true
  shift
fi
step="${1:-300}"
port="${2:-8599}"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT

answering() {  # wait until a URL answers (at most 60 s)
  for _ in $(seq 300); do
    curl -sf "$1" >/dev/null && return 0
    sleep 0.2
  done
  echo "nothing answers at $1" >&2
  return 1
}

began=$(date +%s%N)
streamlit run app.py --server.headless true --server.address localhost --server.port "$port" \
  --browser.gatherUsageStats false >/tmp/minillm-streamlit.log 2>&1 &
pids+=($!)
answering "http://localhost:$port/_stcore/health"
echo "server answering after $(( ($(date +%s%N) - began) / 1000000 )) ms"

if $all; then
  shot() { python docs/screenshot.py "$@" --check-labels --check-lettering; }
  app="http://localhost:$port"
  shot "$app/?step=$step" docs/app.png
  shot "$app/?step=$step" docs/present-step-player-1280x720.png --present --size 1280,720 --check-layout
  shot "$app/?step=$step" docs/present-step-player-1920x1080.png --present --size 1920,1080 --check-layout --kv
  shot "$app/?fleet=replicas&step=40" docs/present-fleet-1280x720.png --present --size 1280,720 --check-layout
  shot "$app/?fleet=pair&step=10" docs/present-fleet-pair-1280x720.png --present --size 1280,720 --check-layout
  for size in 1280x720 1920x1080; do
    shot "$app/" "docs/present-what-if-$size.png" --present --view what-if --play 3 --size "${size/x/,}"
  done
  shot "$app/?step=$step" docs/app-step-player-1280x720.png --size 1280,720
  shot "$app/" docs/app-what-if-1280x720.png --view what-if --play 3 --size 1280,720
  python docs/screenshot.py "$app/?step=14&speculate=4" docs/app-speculation.png --present \
    --size 1280,1500  # the chat windows below the charts: each step's kept guesses underlined
  # the live view: a server with 4 seats, a crowd arriving 4 a second, and a second app watching it (--live)
  serve=$((port + 2))
  python -m minillm serve --port "$serve" --slots 4 >/tmp/minillm-serve.log 2>&1 &
  pids+=($!)
  answering "http://127.0.0.1:$serve/v1/models"
  streamlit run app.py --server.headless true --server.address localhost --server.port $((port + 1)) \
    --browser.gatherUsageStats false -- --live "http://127.0.0.1:$serve" >/tmp/minillm-streamlit-live.log 2>&1 &
  pids+=($!)
  answering "http://localhost:$((port + 1))/_stcore/health"
  python -m minillm load --url "http://127.0.0.1:$serve/v1" --requests 100 --rate-per-s 4 >/dev/null 2>&1 &
  pids+=($!)
  sleep 12  # a crowd in the queue and on every seat
  shot "http://localhost:$((port + 1))/" docs/present-live-1280x720.png --present --size 1280,720
  shot "http://localhost:$((port + 1))/" docs/app-live-1280x720.png --size 1280,720
  ls -l docs/app*.png docs/present-*.png
  exit
fi
out="${OUT:-docs/app.png}"
python docs/screenshot.py "http://localhost:$port/?step=$step" "$out" "${@:3}"
echo "wrote $out"
