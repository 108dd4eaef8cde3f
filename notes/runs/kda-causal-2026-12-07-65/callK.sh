# the KDA causality fix on the GPU: tests, the model check, speed against the old kernel, then the decode tests
t0=$(date +%s); source .gpu/setup.sh
timeout 200 python -m pytest -q -x test_kernels.py -k "do_not_see or grams_by_chunk or grams_chunk or (vs_reference and kda)" 2>&1 | tail -4 | tee $OUT/tests-kda.txt
echo "at $(el) s"
timeout 120 python .gpu/causal.py 'kda*3,softmax' kda 2>&1 | grep -vi warn | tee $OUT/causal.txt
echo "at $(el) s"
timeout 100 python .gpu/kdatime.py 2>&1 | grep -vi warn | tee $OUT/kdatime.txt
left=$(( ${BUDGET:-500} - $(el) - 5 )); echo "decode tests with $left s"
timeout $left python -m pytest -q -x test_kernels.py -k "delta_rule_decode" 2>&1 | tail -4 | tee $OUT/tests-decode.txt
left=$(( ${BUDGET:-500} - $(el) - 5 ))
[ $left -gt 60 ] && timeout $left python -m pytest -q -x tests/test_model.py -k "decoder_steps or cuda_graph_decode_equals_eager" 2>&1 | tail -4 | tee -a $OUT/tests-decode.txt
echo "done at $(el) s"
