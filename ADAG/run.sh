#!/usr/bin/env bash
# Launch ADAG (AGN) on localhost: NUM_PS parameter servers and NUM_WORKERS workers, each
# a train.py process with its own free port. Arguments go to every train.py.
#
#   bash run.sh                        # 1 ps + 2 workers
#   NUM_WORKERS=4 bash run.sh --window 20 --learning_rate 0.5
#   VERBOSE=1 bash run.sh              # keep TensorFlow's start-up log lines
#
# Each line of output starts with the process's role ([ps0], [worker1], [run.sh]). The script
# waits for the workers, then for the parameter servers (which exit by themselves once every
# worker has left), and exits non-zero if any process failed. On the normal end, on Ctrl-C and
# on any failure, it leaves no process behind.
NUM_PS=${NUM_PS:-1}
NUM_WORKERS=${NUM_WORKERS:-2}

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
ports=($("$python" -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("localhost", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' $((NUM_PS + NUM_WORKERS)))) || exit 2
hosts() { local IFS=,; echo "$*"; }
ps_hosts=$(hosts $(for p in "${ports[@]:0:NUM_PS}"; do echo "localhost:$p"; done))
worker_hosts=$(hosts $(for p in "${ports[@]:NUM_PS}"; do echo "localhost:$p"; done))

tmp=$(mktemp -d)
pids=() roles=()
declare -A status
failed=() timer=
record() {  # record N CODE: process N has ended with exit status CODE
  status[$1]=$2
  (($2 == 0)) || failed+=("${roles[$1]} (exit $2)")
}
running() {  # running ROLE_PREFIX: is any such process still running?
  for n in "${!pids[@]}"; do [[ ${roles[$n]} == $1* && -z ${status[$n]:-} ]] && return 0; done
  return 1
}
watch() {  # wait for a child to end and record every one that has; fails when the timer ran out
  local ended code
  wait -n -p ended; code=$?  # bash >= 5.1
  for n in "${!pids[@]}"; do [[ ${pids[$n]} == "${ended:-}" ]] && record "$n" "$code"; done
  for n in "${!pids[@]}"; do  # wait -n can pass over a child that ended while nobody waited
    if [[ -z ${status[$n]:-} ]] && ! kill -0 "${pids[$n]}" 2>/dev/null; then
      wait "${pids[$n]}"; record "$n" $?
    fi
  done
  if [[ -n $timer ]] && { [[ ${ended:-} == "$timer" ]] || ! kill -0 "$timer" 2>/dev/null; }; then
    timer=; return 1
  fi
  return 0
}
start_timer() { sleep "$1" & timer=$!; }
stop_timer() { [[ -n $timer ]] && kill "$timer" 2>/dev/null; timer=; }
cleanup() {  # stop whatever still runs: TERM, then KILL after 5 s
  local alive=()
  for n in "${!pids[@]}"; do [[ -z ${status[$n]:-} ]] && alive+=("${pids[$n]}"); done
  if ((${#alive[@]})); then
    kill -TERM "${alive[@]}" 2>/dev/null
    stop_timer; start_timer 5
    while running ""; do watch || { kill -KILL "${alive[@]}" 2>/dev/null; break; }; done
    stop_timer
  fi
  wait  # the labellers end with their process; let them print the last lines
  rm -rf "$tmp"
}
trap 'cleanup 2>/dev/null' EXIT  # bash may warn here about children it already reaped
trap 'say "interrupted: stopping every process"; exit 130' INT TERM

start() {  # start ROLE JOB INDEX: one train.py, its output labelled through a fifo
  mkfifo "$tmp/$1"
  label "$1" <"$tmp/$1" &
  "$python" "$here/train.py" --job_name "$2" --task_index "$3" \
    --ps_hosts "$ps_hosts" --worker_hosts "$worker_hosts" "${args[@]}" >"$tmp/$1" 2>&1 &
  pids+=($!) roles+=("$1")
  say "started $1 pid=$! at localhost:${ports[${#pids[@]} - 1]}"
}

args=("$@")
for ((i = 0; i < NUM_PS; i++)); do start "ps$i" ps "$i"; done
for ((i = 0; i < NUM_WORKERS; i++)); do start "worker$i" worker "$i"; done

# Wait for the workers. A parameter server that fails while workers run stops the run: the
# workers cannot go on without it.
while running worker; do
  watch
  if running worker && [[ ${failed[*]} == *ps* ]]; then
    say "failed: ${failed[*]}; stopping the workers"; exit 1
  fi
done

# The parameter servers exit by themselves once every worker has left; bound that wait.
start_timer 30
while running ps; do
  watch || { say "the parameter servers did not exit 30 s after the workers"; failed+=(ps); break; }
done
stop_timer

if ((${#failed[@]})); then
  say "failed: ${failed[*]}"; exit 1
fi
say "all processes finished"
# <<< shared: run.sh
