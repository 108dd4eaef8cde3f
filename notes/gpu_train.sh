#!/usr/bin/env bash
# One device call: the short-conv GPU tests, the conv tilings (bench.py --tiles conv), then
# bench.py --train with the given arguments. Usage (device tool): bash notes/gpu_train.sh [bench.py --train args]
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_S:-200} python3 -m pytest -q -n 4 test_kernels.py -k "${TESTS:-short_conv}" > $OUT/tests.txt 2>&1
  echo "tests rc=$?" >> $OUT/tests.txt
  grep -E "passed|failed|error|rc=" $OUT/tests.txt | tail -3; grep -E "^FAILED" $OUT/tests.txt | head -20
fi
[ -z "$SKIP_TILES" ] && timeout 300 python3 bench.py --tiles conv --jobs 4 2>&1 | tee $OUT/conv_tiles.txt
if [ $# -gt 0 ]; then python3 bench.py --train "$@" --json $OUT/train.json 2>&1 | tee $OUT/train.log; fi
