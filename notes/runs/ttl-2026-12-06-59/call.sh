# usage: bash .gpu/call.sh OPTSTEP_MIXER|none MIXERS... : the optimizer-step bench, then the corpus, then the LR sweep
source .gpu/setup.sh
export TIKTOKEN_CACHE_DIR=$PWD/.gpu/tiktoken
t0=$(date +%s)
if [ "$1" != none ]; then python .gpu/optstep.py "$1" 2>&1 | grep -v Warning | grep -E "step|NVIDIA|torch" | tee $OUT/optstep.txt; fi
shift
python data/pkgtext/prepare.py --from_archive data/pkgtext/pkgtext.jsonl.xz --num_proc 16 2>&1 | grep -v "it/s\]" | tail -4
echo "optstep + tokenized at $(( $(date +%s) - t0 )) s"
sha256sum data/pkgtext/*.bin | cut -c1-16
left=$(( ${BUDGET:-575} - ($(date +%s) - t0) ))
timeout --signal=TERM $left python tools/ttl.py run out-sweep --mixers "$@" --lrs 6e-4 1.2e-3 --seeds 1337 -- config/pkgtext.py --max_iters=610 --lr_decay_iters=610 > $OUT/sweep-run.log 2>&1
echo "ttl.py run exit $? at $(( $(date +%s) - t0 )) s"
for d in out-sweep/*/; do n=$(basename $d); mkdir -p $OUT/sweep/$n; cp $d/log.txt $OUT/sweep/$n/; done
python tools/ttl.py report out-sweep --plot $OUT/sweep.png 2>&1
grep -E "^\[|^step|Traceback|rror" $OUT/sweep-run.log | tail -40
