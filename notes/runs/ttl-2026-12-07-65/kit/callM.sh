# Muon: (OPT=1) the optimizer step's cost (the hybrid: AdamW, Muon compiled, Muon eager; measured in (66)), then Muon's sweep at 6e-4 and
# 1.2e-3 for softmax and the hybrid (610 steps, two runs sharing the GPU), reported beside AdamW's sweep
t0=$(date +%s); source .gpu/setup.sh
[ -n "$OPT" ] && timeout 200 python .gpu/optstep.py 'kda*3,softmax' 2>&1 | grep -v Warning | grep -E "step|NVIDIA|torch" | tee $OUT/optstep.txt
echo "optstep at $(el) s"
tokenize
mkdir -p out-msweep && for d in notes/runs/ttl-*/sweep; do cp -rn $d/* out-msweep/; done  # AdamW's sweeps: the baselines
left=$(( ${BUDGET:-570} - $(el) - 25 ))
timeout --signal=TERM $left python tools/ttl.py run out-msweep --mixers softmax 'kda*3,softmax' --optimizers muon --lrs 6e-4 1.2e-3 --seeds 1337 --per_gpu 2 \
  -- config/pkgtext.py --max_iters=610 --lr_decay_iters=610 > $OUT/msweep-run.log 2>&1
echo "ttl.py run exit $? at $(el) s"
tar czf $OUT/msweep.tgz out-msweep/*/log.txt out-msweep/*.console out-msweep/*.shared 2>/dev/null
python tools/ttl.py report out-msweep --plot $OUT/msweep.png 2>&1
grep -E "^\[|^ttl|Traceback|rror" $OUT/msweep-run.log | tail -20
echo "done at $(el) s"
