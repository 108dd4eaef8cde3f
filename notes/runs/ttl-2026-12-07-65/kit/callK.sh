# the KDA forward Grams (per-row forms) on the GPU: tests, the model's causality, speed against f28e14d's kernels.py
t0=$(date +%s); source .gpu/setup.sh
timeout 150 python -m pytest -q -x test_kernels.py -k "do_not_see or grams_by_chunk or (vs_reference and kda)" 2>&1 | tail -4 | tee $OUT/tests-kda.txt
echo "at $(el) s"
timeout 100 python .gpu/causal.py 'kda*3,softmax' kda 2>&1 | grep -vi warn | tee $OUT/causal.txt
echo "at $(el) s"
for r in 1 2; do for d in .gpu/old .; do
  timeout 60 python .gpu/kdatime.py $d $([ $d = . ] && echo new || echo old) 2>&1 | grep "KDA fwd" | tee -a $OUT/kdatime.txt
done; done
echo "done at $(el) s"
