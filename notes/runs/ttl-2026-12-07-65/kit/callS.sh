# a kernel candidate on a branch (the tree checked out here is the candidate; main's kernels.py in .gpu/main/):
# its GPU tests, then KDA's forward+backward, main against the candidate, at init's gates and with every 8th key
# channel near -STRONG (11: 8-row groups, 25: 4-row groups in the Gram backward). Prepare (CPU): git checkout cand-s8 &&
# mkdir -p .gpu/main .gpu/cand && git show main:kernels.py > .gpu/main/kernels.py && cp kernels.py .gpu/cand/
t0=$(date +%s); source .gpu/setup.sh
timeout ${TESTS_S:-200} python -m pytest -q -x test_kernels.py -k "gram_backward_tier or (vs_reference and kda) or grams_by_chunk or do_not_see" 2>&1 | tail -4 | tee $OUT/tests.txt
echo "tests done at $(el) s"
for s in 0 11 25; do for v in main cand; do
  STRONG=$s timeout 120 python .gpu/kdatime.py .gpu/$v $v 2>&1 | grep -E "KDA fwd|rror" | tee -a $OUT/kdatime.txt
done; done
echo "done at $(el) s"
