# the needle models (4 x 128, trained at 512) scored far past their length. Without NEEDLES: train gdn, deltanet,
# kda and the hybrid (two seeds, LR 1e-3, stopped at 0.99), slim their ckpt.pt into $OUT/needle.tgz, score at
# SCALES (default 1 16 64: 512, 8k, 32k). With NEEDLES=1 (needle-*.tgz carried in .gpu/, not the pkgtext archive:
# 64 MiB a call): score them at SCALES, e.g. SCALES=256, then SCALES=2048 SEQ=16 (1M tokens a sequence) in its own call.
t0=$(date +%s); source .gpu/setup.sh
if [ -z "$NEEDLES" ]; then
  timeout ${TRAIN_S:-300} python tools/grid.py --tasks needle --mixers gdn deltanet kda 'kda*3,softmax' --seeds 1337 1338 \
    --learning_rates 1e-3 --stop_at_val_acc=0.99 --jobs 8 --out_root out-needle 2>&1 | grep -v Warn | tail -14 | tee $OUT/needle-grid.txt
  echo "trained at $(el) s"
  rm -f out-needle/needle/*/best.pt; python .gpu/slim.py out-needle/needle/*/ckpt.pt
  for s in 1337 1338; do tar czf $OUT/needle-$s.tgz out-needle/needle/*_s$s/ckpt.pt out-needle/needle/*_s$s/log.txt; done
else  # (a call's files come back up to 16 MiB each: one archive per seed)
  for f in .gpu/needle-*.tgz; do tar xzf $f; done
fi
timeout $(( ${BUDGET:-570} - $(el) - 10 )) python tools/longctx.py needle out-needle/needle/* --scales ${SCALES:-1 16 64} \
  --depths 0 0.5 1 --sequences ${SEQ:-32} --by_depth 2>&1 | grep -v Warn | tee $OUT/needle-long.txt
tar czf $OUT/needle-json.tgz out-needle/needle/*/longctx-needle.json  # each run's cells (--table_only), even if cut
echo "done at $(el) s"
