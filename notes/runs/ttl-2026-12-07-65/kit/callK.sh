# the KDA causality fix on the GPU: tests, the model check, speed against the old kernel, then the decode tests
t0=$(date +%s); source .gpu/setup.sh
timeout 200 python -m pytest -q -x test_kernels.py -k "do_not_see or grams_by_chunk" 2>&1 | tail -4 | tee $OUT/tests-kda.txt
echo "at $(el) s"
timeout 120 python .gpu/causal.py 'kda*3,softmax' kda 2>&1 | grep -vi warn | tee $OUT/causal.txt
echo "at $(el) s"
for r in 1 2; do for d in .gpu/old .; do timeout 60 python .gpu/kdatime.py $d $([ $d = . ] && echo new || echo old) 2>&1 | grep "KDA fwd" | tee -a $OUT/kdatime.txt; done; done
left=$(( ${BUDGET:-500} - $(el) - 5 )); echo "decode tests with $left s"
timeout $left python -m pytest -q -x test_kernels.py -k "delta_rule_decode" 2>&1 | tail -4 | tee $OUT/tests-decode.txt
left=$(( ${BUDGET:-500} - $(el) - 5 ))
[ $left -gt 60 ] && timeout $left python -m pytest -q -x tests/test_model.py -k "decoder_steps or cuda_graph_decode_equals_eager" 2>&1 | tail -4 | tee -a $OUT/tests-decode.txt
echo "done at $(el) s"
