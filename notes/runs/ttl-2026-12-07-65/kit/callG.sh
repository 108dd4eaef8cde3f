# finals on every GPU of one host, each run alone on its GPU: MIXERS="softmax 'kda*3,softmax' gdn kda" SEEDS="1338 1339"
# [OPTIM=muon] [GPUS=N] bash .gpu/callG.sh; each mixer at its best rate in the sweeps of notes/runs (as README's command)
t0=$(date +%s); source .gpu/setup.sh
nvidia-smi -L
tokenize
[ -n "$MIXERS" ] && [ -n "$SEEDS" ] || { echo 'callG.sh: set MIXERS and SEEDS'; exit 2; }
mkdir -p out-sweep out-final
for d in notes/runs/ttl-*/sweep notes/runs/ttl-*/msweep; do [ -d $d ] && cp -rn $d/* out-sweep/; done  # each arm's rate
for d in notes/runs/ttl-*/final/*/; do cp -r $d out-final/; done     # earlier finals: kept, not run again
eval "set -- $MIXERS"
timeout --signal=TERM $(( ${BUDGET:-570} - $(el) - 25 )) python tools/ttl.py run out-final --mixers "$@" \
  --optimizers ${OPTIM:-adamw} --lrs_from out-sweep --seeds $SEEDS --gpus ${GPUS:-$(nvidia-smi -L | wc -l)} \
  -- config/pkgtext.py > $OUT/final-run.log 2>&1
echo "ttl.py run exit $? at $(el) s"
python tools/ttl.py report out-final --baseline softmax --plot $OUT/final.png 2>&1
grep -E "^\[|^ttl|Traceback|rror" $OUT/final-run.log | tail -20
for f in out-final/*.console; do [ -f "$f" ] || continue; echo "== $f"; grep -E "^step|rror|nan" $f | tail -2; done
tar czf $OUT/final.tgz out-final/*/log.txt; echo "done at $(el) s"
