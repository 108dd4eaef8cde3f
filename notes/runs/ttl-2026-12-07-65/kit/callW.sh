# the AdamW learning-rate sweep: MIXERS (bash words) at LRS (default 6e-4 1.2e-3), 610 steps, PER_GPU runs sharing the GPU
t0=$(date +%s); source .gpu/setup.sh
tokenize
mkdir -p out-sweep && for d in notes/runs/ttl-*/sweep; do cp -rn $d/* out-sweep/; done  # the earlier sweeps' logs, for the report
left=$(( ${BUDGET:-570} - $(el) - 25 ))
[ -n "$MIXERS" ] || { echo 'callW.sh: set MIXERS'; exit 2; }
eval "set -- $MIXERS"
timeout --signal=TERM $left python tools/ttl.py run out-sweep --mixers "$@" --lrs ${LRS:-6e-4 1.2e-3} --seeds 1337 --per_gpu ${PER_GPU:-2} \
  -- config/pkgtext.py --max_iters=610 --lr_decay_iters=610 > $OUT/sweep-run.log 2>&1
echo "ttl.py run exit $? at $(el) s"
tar czf $OUT/sweep.tgz out-sweep/*/log.txt out-sweep/*.console out-sweep/*.shared
python tools/ttl.py report out-sweep --plot $OUT/sweep.png 2>&1
grep -E "^\[|^ttl|Traceback|rror" $OUT/sweep-run.log | tail -20
for f in out-sweep/*.console; do echo "== $f"; grep -E "^step|rror|nan" $f | tail -4; done
echo "done at $(el) s"
