#!/bin/bash
# point 7: 300 steps of config/pystdlib.py per mixer on the 2-core CPU (two runs at a time, one thread each)
cd /work/main
export TIKTOKEN_CACHE_DIR=/work/shared/tiktoken OMP_NUM_THREADS=1
run() { m=$1; d=/work/runs7/$(echo "$m" | sed 's/\*/x/g; s/,/+/g'); /usr/bin/time -f "%e s wall" python train.py config/pystdlib.py --mixer="$m" --out_dir=$d --device=cpu > $d.out 2>&1; echo "$m done $(tail -1 $d.out)"; }
for pair in "softmax retnet" "mamba2 deltanet" "gdn kda" "gla kda*3,softmax"; do
  set -- $pair
  run "$1" & run "$2" & wait
done
