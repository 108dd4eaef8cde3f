# issue 14 (l3): GPU tests after the kernel edit, then GDN's <S, dS'> placement A/B and a profile, alone
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -n 8 test_kernels.py -k "triton and not linear_attn" > $OUT/tests.txt 2>&1; echo "tests rc=$?" >> $OUT/tests.txt
grep -E "passed|failed|rc=" $OUT/tests.txt | tail -3; grep -E "^FAILED" $OUT/tests.txt | head
timeout 200 python3 notes/delta_tiles.py --only gdn_sds --variants deltanet,gdn --shapes 8,4096,16,64:8,4096,16,128 2>&1 | tee $OUT/tiles.txt
timeout 80 python3 bench.py --profile --variants deltanet,gdn --shape 8,4096,16,64 > $OUT/profile.txt 2>&1; grep -v Warn $OUT/profile.txt | head -48
