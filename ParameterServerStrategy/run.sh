#!/usr/bin/env bash
# Run this folder's train.py on localhost: NUM_PS parameter servers, NUM_WORKERS workers and the
# coordinator (chief), each a process on a free port; every argument goes to every train.py.
#   bash run.sh          NUM_WORKERS=4 bash run.sh --steps 4000          VERBOSE=1 bash run.sh
NUM_PS=${NUM_PS:-1} NUM_WORKERS=${NUM_WORKERS:-2}
here=$(cd "$(dirname "$0")" && pwd) python=${PYTHON:-python3} tmp=$(mktemp -d) pids=() roles=()
trap 'rm -rf "$tmp"' EXIT  # the fifos that carry each process's output to its label
[[ " $* " == *" --log_dir"* ]] || set -- --log_dir "$here/logs/$(date +%Y%m%d-%H%M%S)-$$" "$@"
args=("$@"); export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
start() {  # start JOB INDEX: one train.py in the background, its output labelled with its role
  local role=$1$2; mkfifo "$tmp/$role"; label "$role" <"$tmp/$role" &
  "$python" "$here/train.py" --job_name "$1" --task_index "$2" --ps_hosts "$ps_hosts" \
    --worker_hosts "$worker_hosts" --chief_host "$chief_host" "${args[@]}" >"$tmp/$role" 2>&1 &
  pids+=($!) roles+=("$role"); echo "[run.sh] started $role pid=$! at ${hosts[${#pids[@]} - 1]}"
}
label() {  # prefix each line with the role; drop TensorFlow's start-up chatter unless VERBOSE=1
  local line noise='^(To enable the following|WARNING: All log messages before|E[0-9]{4} .*cuInit'
  noise+='|[IW][0-9]{4} [0-9:. ]+ [0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\])'
  while IFS= read -r line || [[ -n $line ]]; do
    [[ ${VERBOSE:-0} != 1 && $line =~ $noise ]] || echo "[$1] ${line#\[$1\] }"
  done
}
[[ $NUM_PS =~ ^[1-9][0-9]*$ && $NUM_WORKERS =~ ^[1-9][0-9]*$ ]] ||
  { echo "[run.sh] error: NUM_PS and NUM_WORKERS must be positive integers" >&2; exit 2; }
hosts=($("$python" -c 'import os, random, socket, sys  # free ports, below those the kernel
f, s, n = "/proc/sys/net/ipv4/ip_local_port_range", [], int(sys.argv[1])  # gives clients, each
top = int(open(f).read().split()[0]) if os.path.exists(f) else 32768  # bound until all are picked
for p in random.sample(range(10000, top), max(top - 10000, 0)) + [0] * n:
  if len(s) < n:
    try: s.append(socket.socket()); s[-1].bind(("", p))
    except OSError: s.pop().close()
print(*["localhost:%d" % x.getsockname()[1] for x in s])' $((NUM_PS + NUM_WORKERS + 1)))) || exit 2
ps_hosts=$(IFS=,; echo "${hosts[*]:0:NUM_PS}") chief_host=${hosts[NUM_PS + NUM_WORKERS]}
worker_hosts=$(IFS=,; echo "${hosts[*]:NUM_PS:NUM_WORKERS}")
for ((i = 0; i < NUM_PS; i++)); do start ps $i; done
for ((i = 0; i < NUM_WORKERS; i++)); do start worker $i; done
start chief 0

# Supervise until every process has ended. A failed ps or coordinator stops the others; a lost
# worker does not (the coordinator moves its work). The others end once the coordinator has.
running() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
stop() {  # TERM every process still running; KILL what is left after 5 s
  kill -TERM "${pids[@]}" 2>/dev/null; for ((t = 0; t < 50; t++)); do running && sleep 0.1; done
  kill -KILL "${pids[@]}" 2>/dev/null; wait
}
trap 'echo "[run.sh] interrupted: stopping every process"; stop; exit 130' INT TERM
codes=() failed="" chief_done=0 ticks=0
while running; do
  sleep 0.2  # the pace of the checks
  ((chief_done == 0 || ticks++ < 150)) || { failed+=" servers (alive 30 s on)"; stop; }
  for i in "${!pids[@]}"; do
    [[ -z ${codes[i]} ]] && ! kill -0 "${pids[i]}" 2>/dev/null || continue
    wait "${pids[i]}"; codes[i]=$?; [[ ${roles[i]} == chief0 ]] && chief_done=1
    ((codes[i])) || continue; failed+=" ${roles[i]} (exit ${codes[i]})"
    [[ ${roles[i]} == chief0 ]] && echo "[run.sh] the coordinator (chief0) failed; resume from" \
      "its last checkpoint with: NUM_PS=$NUM_PS NUM_WORKERS=$NUM_WORKERS bash $here/run.sh$(
        printf ' %q' "${args[@]}")"
    if [[ ${roles[i]} == ps* || ${roles[i]} == chief0 ]] && running; then
      echo "[run.sh] failed:$failed; stopping the others"; stop; exit 1
    fi
  done
done
wait  # the labels print the last lines
[[ -z $failed ]] || { echo "[run.sh] failed:$failed"; exit 1; }
echo "[run.sh] all processes finished"
