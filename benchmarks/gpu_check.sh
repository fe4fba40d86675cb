#!/usr/bin/env bash
# The examples' GPU paths, checked on a machine with one NVIDIA GPU, in under 10 minutes:
#   bash benchmarks/gpu_check.sh               # pip install deploy/requirements-gpu.txt, then check
#   bash benchmarks/gpu_check.sh --no-install  # the TensorFlow already installed
#   bash benchmarks/gpu_check.sh --dry-run     # no GPU needed: the same runs on the CPU, tiny
#   --out FILE: the table there (default benchmarks/results/gpu_check.md; gpu_check-dry-run.md)
# One row per check, on stdout and in the file; every run's log under results/logs/gpu_check/.
# Exit status: 0 every check passed, 1 one failed, 2 bad usage, 3 no GPU here (nothing done),
# 4 TensorFlow sees no GPU. PYTHON picks the interpreter (default python3).
set -u
here=$(cd "$(dirname "$0")" && pwd) root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3} dry_run=0 install=1 out=""
while (($#)); do
  case $1 in
    --dry-run) dry_run=1 ;;
    --no-install) install=0 ;;
    --out) [[ $# -ge 2 ]] || { echo "gpu_check: error: --out needs a file" >&2; exit 2; }
           out=$2; shift ;;
    -h | --help) sed -n '2,9p' "$0" | cut -c3-; exit 0 ;;
    *) echo "gpu_check: error: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# --- Is there a GPU? ------------------------------------------------------------------------------
if ((dry_run)); then
  gpu="none: a dry run, every check on the CPU ($(nproc) cores)"
else
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
        head -1)
  if [[ -z $gpu || ${CUDA_VISIBLE_DEVICES-unset} == "" || ${CUDA_VISIBLE_DEVICES-} == -1 ]]; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides" \
      "it): nothing was run; --dry-run runs the same checks on the CPU" >&2
    exit 3
  fi
fi

# --- Sizes: a real run on the GPU, or a smoke run of the same sequence on the CPU ----------------
if ((dry_run)); then
  export GPU_CHECK_ON=cpu  # benchmarks/gpu_check.py: the CPU's devices, nothing split
  steps=40 log_every=20 tower_steps=40 tower_log_every=20 pipeline_steps=20 heavy_steps=20
  limit=240  # seconds any one run may take (TensorFlow starts slowly on a busy CPU)
else
  export GPU_CHECK_ON=gpu
  steps=2000 log_every=500 tower_steps=300 tower_log_every=100 pipeline_steps=300 heavy_steps=2000
  limit=150
fi
[[ -n $out ]] || out=$here/results/gpu_check$( ((dry_run)) && echo -dry-run).md
mkdir -p "$(dirname "$out")"
logs=$(cd "$(dirname "$out")" && pwd)/logs/gpu_check
rm -rf "$logs" && mkdir -p "$logs"
unset TF_CONFIG  # every run gets its cluster from its flags
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
failures=0

# --- Running and judging --------------------------------------------------------------------------
launch() {  # launch DIR NAME [VAR=VALUE...] -- COMMAND...: in the background, at most $limit s;
  # the command and its output in DIR/NAME.log, its exit status in DIR/NAME.rc
  local dir=$1 name=$2 vars=()
  shift 2
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  echo "\$ ${vars[*]} $*" >"$dir/$name.log"
  (
    env "${vars[@]}" timeout -k 10 "$limit" "$@" >>"$dir/$name.log" 2>&1 &
    echo $! >"$dir/$name.pid"
    wait $!
    echo $? >"$dir/$name.rc"
  ) &
}
stop_all() {  # the runs still going (their timeout passes the signal on to the command)
  for f in "$logs"/*/*.pid; do [[ -e $f ]] && kill -TERM "$(cat "$f")" 2>/dev/null; done
  wait
}
trap 'echo "gpu_check: interrupted: stopping the runs"; stop_all; exit 130' INT TERM
free_ports() {  # free_ports N: N localhost:port, every probe bound until all are picked
  "$python" -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]; [x.bind(("localhost", 0)) for x in s]
print(*["localhost:%d" % x.getsockname()[1] for x in s])' "$1"
}
row() {  # row TEXT: one line of the table, on stdout and in the file
  echo "$1" | tee -a "$out"
}
judge() {  # judge CHECK DIR: benchmarks/gpu_check.py reads the logs and writes the row
  local line
  line=$("$python" "$here/gpu_check.py" row "$1" "$2") || failures=$((failures + 1))
  row "$line"
}
new_check() {  # new_check NAME: its folder of logs
  mkdir -p "$logs/$1" && echo "$logs/$1"
}

# --- The checks, one row each ---------------------------------------------------------------------
towers() {  # In-Graph-Replication: 1 tower on the GPU, then 2 towers on 2 logical GPUs of it
  local dir flags
  dir=$(new_check towers)
  flags=(--steps "$tower_steps" --log_every "$tower_log_every" --batch_size 64 --seed 0)
  # the same arithmetic on both: TF32 (Ampere and later) would round matmuls per shape
  launch "$dir" one NVIDIA_TF32_OVERRIDE=0 -- \
    "$python" "$root/In-Graph-Replication/train.py" --devices 1 "${flags[@]}" --log_dir "$dir/one"
  wait  # one process at a time: a session without a memory limit takes the whole GPU
  launch "$dir" two NVIDIA_TF32_OVERRIDE=0 -- "$python" "$here/gpu_check.py" towers \
    In-Graph-Replication --devices 2 "${flags[@]}" --log_dir "$dir/two"
  wait
  judge towers "$dir"
}

ps_cluster() {  # ps_cluster EXAMPLE: a ps that sees no GPU, 2 workers sharing the GPU
  local example=$1 dir hosts cluster
  dir=$(new_check "$example")
  hosts=($(free_ports 3))
  cluster=(--ps_hosts "${hosts[0]}" --worker_hosts "${hosts[1]},${hosts[2]}"
           --steps "$steps" --log_every "$log_every" --log_dir "$dir/train")
  # TF_CPP_MIN_LOG_LEVEL=0: TensorFlow logs each device it creates, which the row reads
  launch "$dir" ps0 CUDA_VISIBLE_DEVICES= TF_CPP_MIN_LOG_LEVEL=0 -- \
    "$python" "$root/$example/train.py" --job_name ps --task_index 0 "${cluster[@]}"
  for i in 0 1; do  # grow their memory as needed, or the first takes the whole GPU
    launch "$dir" "worker$i" TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=0 -- \
      "$python" "$root/$example/train.py" --job_name worker --task_index "$i" "${cluster[@]}"
  done
  wait
  judge "$example" "$dir"
}

mirrored() {  # MultiWorkerMirroredStrategy: 2 workers, each the GPU as 2 logical GPUs
  local dir hosts
  dir=$(new_check mirrored)
  hosts=($(free_ports 2))
  for i in 0 1; do
    launch "$dir" "worker$i" -- "$python" "$here/gpu_check.py" replicas 2 \
      MultiWorkerMirroredStrategy --job_name worker --task_index "$i" \
      --worker_hosts "${hosts[0]},${hosts[1]}" --steps "$steps" --learning_rate 0.1 \
      --log_every "$log_every" --log_dir "$dir/train"
  done
  wait
  judge mirrored "$dir"
}

pipeline() {  # Model-Parallel-Pipeline: 2 stages on 2 logical GPUs, M = 1 and M = 4
  local dir m
  dir=$(new_check pipeline)
  for m in 1 4; do  # a traced step in every 10, as the example measures its busy fractions
    launch "$dir" "m$m" -- "$python" "$here/gpu_check.py" towers Model-Parallel-Pipeline \
      --devices 2 --micro_batches "$m" --steps "$pipeline_steps" --log_every 10 \
      --log_dir "$dir/m$m"
    wait
  done
  judge pipeline "$dir"
}

heavy() {  # the scaling benchmark's workload in one process: the GPU, then the CPU alone
  local dir flags
  dir=$(new_check heavy)
  flags=(--hidden 4096 --batch_size 512 --steps "$heavy_steps" --log_every "$heavy_steps")
  launch "$dir" gpu -- "$python" "$root/Non-Distributed-Setup/train.py" "${flags[@]}" \
    --log_dir "$dir/gpu"
  wait
  launch "$dir" cpu CUDA_VISIBLE_DEVICES= -- "$python" "$root/Non-Distributed-Setup/train.py" \
    "${flags[@]}" --log_dir "$dir/cpu"
  wait
  judge heavy "$dir"
}

# --- The run --------------------------------------------------------------------------------------
: >"$out"
row "| check | result | detail |"
row "|---|---|---|"
row "| GPU | $( ((dry_run)) && echo "skipped" || echo "ok") | $gpu |"
requirements=deploy/requirements-gpu.txt
if ((dry_run || !install)); then
  row "| pip install -r $requirements | skipped: $( ((dry_run)) && echo "a dry run" ||
    echo "--no-install") | |"
elif timeout 300 "$python" -m pip install -r "$root/$requirements" >"$logs/install.log" 2>&1; then
  row "| pip install -r $requirements | ok | into $("$python" -c 'import sys; print(sys.prefix)') |"
else
  row "| pip install -r $requirements | FAILED | $(tail -1 "$logs/install.log") |"
  failures=$((failures + 1))
fi
tensorflow=$(timeout 120 "$python" -c 'import tensorflow as tf
print("TensorFlow %s sees %d GPU(s)" % (tf.__version__, len(tf.config.list_physical_devices("GPU"))))' \
  2>"$logs/tensorflow.log" | tail -1)
if ((!dry_run)) && [[ $tensorflow != *" sees "[1-9]* ]]; then
  row "| TensorFlow sees the GPU | FAILED | ${tensorflow:-no TensorFlow: $(tail -1 "$logs/tensorflow.log")} |"
  echo "gpu_check: TensorFlow sees no GPU; its log: $logs/tensorflow.log" >&2
  exit 4
fi
row "| TensorFlow | ok | $tensorflow |"
towers
ps_cluster Distributed-Setup
ps_cluster Sync-SGD
mirrored
pipeline
heavy
row ""
row "\`bash benchmarks/gpu_check.sh$( ((dry_run)) && echo " --dry-run")\`: $(date -u +%F), $SECONDS s in all, $failures check(s) failed; the runs' logs in ${logs#$root/}."
((failures == 0))
