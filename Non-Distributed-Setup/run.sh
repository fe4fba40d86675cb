#!/usr/bin/env bash
# Run the one-process baseline; every argument goes to train.py (see python train.py --help).
#   bash run.sh          bash run.sh --steps 3000 --batch_size 128          VERBOSE=1 bash run.sh
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
label() {  # prefix each line with the role; drop TensorFlow's start-up chatter unless VERBOSE=1
  local line noise='^(To enable the following|WARNING: All log messages before|E[0-9]{4} .*cuInit'
  noise+='|[IW][0-9]{4} [0-9:. ]+ [0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\])'
  while IFS= read -r line || [[ -n $line ]]; do
    [[ ${VERBOSE:-0} != 1 && $line =~ $noise ]] || echo "[$1] ${line#\[$1\] }"
  done
}
set -o pipefail
"${PYTHON:-python3}" "$here/train.py" "$@" 2>&1 | label local
