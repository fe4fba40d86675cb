#!/usr/bin/env bash
# Launch this example on localhost: NUM_PS parameter servers and NUM_WORKERS workers, each a
# train.py process with its own free port. Arguments are passed on to every train.py.
#
#   bash run.sh                        # defaults below
#   NUM_WORKERS=3 bash run.sh --steps 3000
#   VERBOSE=1 bash run.sh              # keep TensorFlow's start-up log lines
#
# Each line of output starts with the process's role ([ps0], [worker1], [run.sh]). The script
# waits for the workers, then for the parameter servers (which exit by themselves once every
# worker has left), and exits non-zero if any process failed. On the normal end, on Ctrl-C and
# on any failure, it leaves no process behind.
NUM_PS=${NUM_PS:-1}
NUM_WORKERS=${NUM_WORKERS:-1}

# >>> shared: label
# Prefix each line with the role; drop TensorFlow's start-up chatter unless VERBOSE=1.
label() {
  if [[ ${VERBOSE:-0} == 1 ]]; then sed -u "s/^/[$1] /"; return; fi
  sed -u -E -e '/^WARNING: All log messages before absl::InitializeLog/d' \
    -e '/^[IW][0-9]{4} [0-9:. ]+[0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\]/d' \
    -e '/^To enable the following instructions: /d' -e '/^E[0-9]{4} .*(cuInit|cuda_)/d' \
    -e "/^\[$1\] /!s/^/[$1] /"
}
# <<< shared: label

# >>> shared: run.sh
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
say() { echo "[run.sh] $*"; }

if ! [[ $NUM_PS =~ ^[1-9][0-9]*$ && $NUM_WORKERS =~ ^[1-9][0-9]*$ ]]; then
  echo "[run.sh] error: NUM_PS and NUM_WORKERS must be positive integers" >&2; exit 2
fi

# Free ports, chosen by the OS; all sockets stay open until every port is picked, so they differ.
read -r -a ports < <("$python" -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("localhost", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' $((NUM_PS + NUM_WORKERS))) || exit 2
hosts() { local IFS=,; echo "$*"; }
ps_hosts=$(hosts $(for p in "${ports[@]:0:NUM_PS}"; do echo "localhost:$p"; done))
worker_hosts=$(hosts $(for p in "${ports[@]:NUM_PS}"; do echo "localhost:$p"; done))

tmp=$(mktemp -d)
pids=() roles=() labellers=()
cleanup() {
  local alive=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  if ((${#alive[@]})); then
    kill -TERM "${alive[@]}" 2>/dev/null
    ( sleep 5; kill -KILL "${alive[@]}" 2>/dev/null ) & local reaper=$!
    wait "${alive[@]}" 2>/dev/null
    kill "$reaper" 2>/dev/null; wait "$reaper" 2>/dev/null
  fi
  ((${#labellers[@]})) && wait "${labellers[@]}" 2>/dev/null
  rm -rf "$tmp"
}
trap 'cleanup' EXIT
trap 'say "interrupted: stopping every process"; exit 130' INT TERM

start() {  # start ROLE JOB INDEX: one train.py, its output labelled through a fifo
  mkfifo "$tmp/$1"
  label "$1" <"$tmp/$1" & labellers+=($!)
  "$python" "$here/train.py" --job_name "$2" --task_index "$3" \
    --ps_hosts "$ps_hosts" --worker_hosts "$worker_hosts" "${args[@]}" >"$tmp/$1" 2>&1 &
  pids+=($!) roles+=("$1")
  say "started $1 pid=$! at localhost:${ports[${#pids[@]} - 1]}"
}

args=("$@")
for ((i = 0; i < NUM_PS; i++)); do start "ps$i" ps "$i"; done
for ((i = 0; i < NUM_WORKERS; i++)); do start "worker$i" worker "$i"; done

# Wait for the workers. A parameter server that fails while workers run stops the run, since
# the workers cannot go on without it.
declare -A status
failed=()
reap() {  # reap N: record the exit status of process N, which has ended
  wait "${pids[$1]}"; status[$1]=$?
  ((status[$1] == 0)) || failed+=("${roles[$1]} (exit ${status[$1]})")
}
workers_running() {
  for n in "${!pids[@]}"; do [[ ${roles[$n]} == worker* && -z ${status[$n]:-} ]] && return 0; done
  return 1
}
while workers_running; do
  wait -n
  for n in "${!pids[@]}"; do
    [[ -z ${status[$n]:-} ]] && ! kill -0 "${pids[$n]}" 2>/dev/null && reap "$n"
  done
  for ((n = 0; n < NUM_PS; n++)); do
    if [[ -n ${status[$n]:-} ]] && ((status[$n] != 0)) && workers_running; then
      say "failed: ${failed[*]}; stopping the workers"; exit 1
    fi
  done
done

# The parameter servers exit by themselves once every worker has left; bound that wait.
( sleep 30; kill -KILL "${pids[@]:0:NUM_PS}" 2>/dev/null ) & watchdog=$!
for ((n = 0; n < NUM_PS; n++)); do
  [[ -n ${status[$n]:-} ]] && continue
  reap "$n"
done
kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null

if ((${#failed[@]})); then
  say "failed: ${failed[*]}"; exit 1
fi
say "all processes finished"
# <<< shared: run.sh
