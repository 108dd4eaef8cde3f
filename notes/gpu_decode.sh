#!/usr/bin/env bash
# One device call for issue 16: the CUDA-graph decode tests on the GPU, then bench.py --model_decode.
# Usage (device tool): bash notes/gpu_decode.sh [bench.py --model_decode args]   env: SKIP_TESTS=1, TESTS (a -k expression)
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_S:-300} python3 -m pytest -q -n ${NPROC:-4} test_model.py -k "${TESTS:-cuda_graph}" > $OUT/tests.txt 2>&1
  echo "tests rc=$?" >> $OUT/tests.txt
  grep -E "passed|failed|error|rc=" $OUT/tests.txt | tail -3
  grep -E "^FAILED|Error" $OUT/tests.txt | head -20
fi
[ $# -gt 0 ] && python3 bench.py --model_decode "$@" 2>&1 | grep -v "^kernels:" | tee $OUT/decode.txt
exit 0
