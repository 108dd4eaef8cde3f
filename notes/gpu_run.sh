#!/usr/bin/env bash
# One device call: the delta-rule GPU tests (compiling our kernels), then bench.py (fla's kernels compile in its run).
# Usage (device tool, carry .whl): bash notes/gpu_run.sh [bench.py args]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
timeout ${TEST_S:-330} python3 -m pytest -q -n ${NPROC:-8} test_kernels.py -k "${TESTS:-triton and not linear_attn}" \
    > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/tests.txt
grep -E "passed|failed|error|rc=" $OUT/tests.txt | tail -5
grep -E "^FAILED|Error|errors over" $OUT/tests.txt | head -20
python3 bench.py "$@" 2>&1 | tee $OUT/bench.txt
