# issue 14 (l): fla compiles while our kernels compile (GPU tests), then a profile and the graph-timed bench alone
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in kda deltanet; do timeout 400 python3 notes/fla_warm.py $v > $OUT/warm-$v.txt 2>&1 & done
( timeout 400 python3 -m pytest -q -n 6 test_kernels.py -k "triton and not linear_attn" > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/tests.txt ) &
wait
tail -2 $OUT/warm-*.txt; tail -3 $OUT/tests.txt
timeout 60 python3 bench.py --profile --variants deltanet,gdn --shape 8,4096,16,64 > $OUT/profile.txt 2>&1
timeout 120 python3 bench.py --variants deltanet,gdn 2>&1 | tee $OUT/bench-graph.txt
