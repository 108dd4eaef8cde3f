# one final time-to-loss run alone on the GPU: [OPTIM=muon] bash .gpu/callF.sh MIXER LR SEED; then (TESTS=1) the decode GPU tests
t0=$(date +%s); source .gpu/setup.sh
tokenize
[ -n "$CAUSAL" ] && timeout 200 python .gpu/causal.py $CAUSAL 2>&1 | grep -vi warn | tee $OUT/causal.txt
mkdir -p out-final && for d in notes/runs/ttl-*/final/*/; do cp -r $d out-final/ 2>/dev/null; done  # earlier finals, for the report
timeout $(( ${BUDGET:-570} - $(el) - 40 )) python tools/ttl.py run out-final --mixers "$1" --optimizers ${OPTIM:-adamw} --lrs $2 --seeds $3 -- config/pkgtext.py > $OUT/final-run.log 2>&1
echo "ttl.py run exit $? at $(el) s"
base=softmax; ls out-final | grep -q '^softmax_' || base="$1"
python tools/ttl.py report out-final --baseline "$base" --plot $OUT/final.png 2>&1
grep -E "^\[|^ttl|Traceback|rror|^step" $OUT/final-run.log | tail -8
run=$(ls -d out-final/$(python -c "import sys; sys.path.insert(0, 'tools'); from ttl import run_name; print(run_name('$1', '${OPTIM:-adamw}', $2, $3))"))
if [ -n "$TEXT" ]; then  # the run's text loss by position, to 128 x 4,096 = 524,288 tokens (the val split holds ~553k)
  left=$(( ${BUDGET:-570} - $(el) - 15 - ${GATES:+4}5 ))
  if [ $left -ge 30 ]; then
    timeout $left python tools/longctx.py text $run --scales 1 2 4 8 16 32 64 128 --windows 1 2>&1 | grep -v Warn | tee $OUT/text.txt
    [ -f $run/longctx-text.json ] && gzip -c $run/longctx-text.json > $OUT/longctx-text.json.gz
  else echo "text: skipped, $left s left"; fi
fi
if [ -n "$GATES" ]; then  # the trained model's KDA gates: the kernels' forms and time against init's gates
  left=$(( ${BUDGET:-570} - $(el) - 10 ))
  # (fla's chunk_kda beside ours where .gpu/whl holds its wheels: pip download --no-deps -d .gpu/whl fla-core==0.6.0 einops)
  [ $left -ge 20 ] && FLA=$([ -d .gpu/whl ] && echo .gpu/whl) timeout $left python .gpu/gatetime.py $run 2>&1 | grep -v Warn | tee $OUT/gates.txt || echo "gates: skipped or cut"
fi
if [ -n "$TESTS" ]; then
  left=$(( ${BUDGET:-570} - $(el) - 10 ))
  echo "decode tests with $left s left"; [ $left -lt 30 ] && left=1
  (timeout $left python -m pytest -q -x test_kernels.py -k "delta_rule_decode" 2>&1 | tail -6
   timeout 200 python -m pytest -q -x tests/test_model.py -k "decoder_steps or cuda_graph_decode_equals_eager" 2>&1 | tail -6) | tee $OUT/tests.txt
fi
if [ -n "$DECV" ]; then  # the hybrid's batch-1 step at 4k: one program a head (128) against the V-tiles (auto)
  for v in $DECV; do
    left=$(( ${BUDGET:-570} - $(el) - 10 )); [ $left -lt 60 ] && break
    timeout $left python .gpu/decv.py $v --mixers 'kda*3,softmax' --contexts 4096 --batches 1 --steps 256 2>&1 | grep -E "^\||decode_v|rror" | tee -a $OUT/decv.txt
  done
fi
tar czf $OUT/final.tgz out-final/*/log.txt; echo "done at $(el) s"
