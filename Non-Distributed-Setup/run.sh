#!/usr/bin/env bash
# Run the one-process baseline; every argument goes to train.py (see python train.py --help).
#   bash run.sh          bash run.sh --steps 3000 --batch_size 128          VERBOSE=1 bash run.sh
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
label() {  # prefix each line with the role; drop TensorFlow's start-up chatter unless VERBOSE=1
  [[ ${VERBOSE:-0} == 1 ]] && exec sed -u "s/^/[$1] /"
  exec sed -u -E -e '/^WARNING: All log messages before absl::InitializeLog/d' \
    -e '/^[IW][0-9]{4} [0-9:. ]+[0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\]/d' \
    -e '/^To enable the following instructions: /d' -e '/^E[0-9]{4} .*(cuInit|cuda_)/d' \
    -e "/^\[$1\] /!s/^/[$1] /"
}
set -o pipefail
"${PYTHON:-python3}" "$here/train.py" "$@" 2>&1 | label local
