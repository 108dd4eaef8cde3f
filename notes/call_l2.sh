# issue 14 (l2): GPU tests of the new kernels while the old ones compile, then old vs new bench alone
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
( timeout 330 python3 -m pytest -q -n 8 test_kernels.py -k "triton and not linear_attn" > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/tests.txt ) &
timeout 300 python3 notes/old/bench.py --variants deltanet,gdn --timing eager > $OUT/old-warm.txt 2>&1
timeout 200 python3 notes/fla_warm.py deltanet > $OUT/warm.txt 2>&1
wait
grep -E "passed|failed|rc=" $OUT/tests.txt | tail -3; grep -E "^FAILED" $OUT/tests.txt | head
echo OLD; timeout 100 python3 notes/old/bench.py --variants deltanet,gdn 2>&1 | tee $OUT/bench-old.txt
echo NEW; timeout 100 python3 bench.py --variants deltanet,gdn 2>&1 | tee $OUT/bench-new.txt
