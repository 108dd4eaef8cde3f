# after this session's last kernel edit: the delta-rule GPU tests and the document/conv ones, then the graph-timed
# DeltaNet / GDN table (fla's DeltaNet compiled first)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
( timeout 330 python3 -m pytest -q -n 8 test_kernels.py -k "triton and not linear_attn" > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/tests.txt ) &
PYTHONPATH=/tmp/site timeout 200 python3 notes/fla_warm.py deltanet > $OUT/warm.txt 2>&1
wait
timeout 150 python3 -m pytest -q -n 8 test_kernels.py test_model.py test_mixers.py -k "document or conv" > $OUT/tests-docs.txt 2>&1; echo "tests rc=$?" >> $OUT/tests-docs.txt
grep -E "passed|failed|rc=" $OUT/tests.txt $OUT/tests-docs.txt | tail -6; grep -hE "^FAILED" $OUT/tests*.txt | head
PYTHONPATH=/tmp/site timeout 100 python3 bench.py --variants deltanet,gdn 2>&1 | tee $OUT/bench.txt
