#!/usr/bin/env bash
# Run the one-process baseline; arguments are passed on to train.py.
#
#   bash run.sh                        # defaults: see python train.py --help
#   bash run.sh --steps 3000 --batch_size 128
#   VERBOSE=1 bash run.sh              # keep TensorFlow's start-up log lines
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

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

"$python" "$here/train.py" "$@" 2>&1 | label local
