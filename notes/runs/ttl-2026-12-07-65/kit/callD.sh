# the decode step on the GPU: the GEMV / PDL / draw tests (the model's set ran past 200 s on an H100 in (69), its
# cuda_graph tests alone 113 s: TEST_S, default 320), then decstep.py (before/after in one process), then (if time
# is left) bench_decode at 4k and 128k (issue 69's table; BENCH=0 skips it)
t0=$(date +%s); source .gpu/setup.sh
timeout 200 python -m pytest -q -x test_kernels.py -k "gemv or linear_step or chained or delta_rule_decode" 2>&1 | tail -4 | tee $OUT/tests-gemv.txt
timeout ${TEST_S:-320} python -m pytest -q -x tests/test_model.py -k "decoder or decode or cuda_graph or sample or argmax" 2>&1 | tail -4 | tee -a $OUT/tests-gemv.txt
echo "tests done at $(el) s"
left=$(( ${BUDGET:-570} - $(el) - 10 ))
timeout $left python .gpu/decstep.py ${MIXERS:-'kda*3,softmax' kda} 2>&1 | grep -vi warn | grep -E "ms/token|failed|rror" | tee $OUT/decstep.txt
echo "decstep done at $(el) s"
left=$(( ${BUDGET:-570} - $(el) - 10 ))
if [ "${BENCH:-1}" != 0 ] && [ $left -ge 90 ]; then
  timeout $left python tools/bench_decode.py --mixers 'kda*3,softmax' softmax kda gdn --contexts 4096 131072 --batches max \
    --json $OUT/decode.json 2>&1 | grep -vi warn | tail -30 | tee $OUT/bench-decode.txt
fi
echo "done at $(el) s"
