#!/usr/bin/env bash
# One device call: the CUDA-graph decode tests on the GPU, then bench.py --model_decode.
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
if [ -n "$SAMPLE" ]; then  # sample.py on the GPU, graph and eager, from a random 12-layer hybrid saved as a task model
  mkdir -p /tmp/ck && python3 -c "
import torch; from model import GPT, GPTConfig
a = dict(n_layer=12, n_head=12, n_embd=768, head_dim=128, vocab_size=64, block_size=1024, mixer='kda*3,softmax')
torch.save(dict(model=GPT(GPTConfig(**a)).state_dict(), model_args=a, config=dict(dataset='mqar')), '/tmp/ck/ckpt.pt')
"
  for g in True False; do
    python3 sample.py --out_dir=/tmp/ck --start="3 20 5 25 0 3" --num_samples=4 --max_new_tokens=256 --cuda_graph=$g 2>&1 \
      | grep -v "^kernels:" | grep -E "captured|prefill|cache at|Error" ; done
fi
[ $# -gt 0 ] && python3 bench.py --model_decode "$@" 2>&1 | grep -v "^kernels:" | tee $OUT/decode.txt
exit 0
