# the needle models (4 x 128, trained at 512) scored far past their length. Without NEEDLES: train gdn, deltanet,
# kda and the hybrid (two seeds, LR 1e-3, stopped at 0.99), slim their ckpt.pt into $OUT/needle.tgz, score at
# SCALES (default 1 16 64: 512, 8k, 32k). With NEEDLES=1 (needle.tgz carried in .gpu/): score them at SCALES.
t0=$(date +%s); source .gpu/setup.sh
if [ -z "$NEEDLES" ]; then
  timeout ${TRAIN_S:-300} python tools/grid.py --tasks needle --mixers gdn deltanet kda 'kda*3,softmax' --seeds 1337 1338 \
    --learning_rates 1e-3 --stop_at_val_acc=0.99 --jobs 8 --out_root out-needle 2>&1 | grep -v Warn | tail -14 | tee $OUT/needle-grid.txt
  echo "trained at $(el) s"
  rm -f out-needle/needle/*/best.pt; python .gpu/slim.py out-needle/needle/*/ckpt.pt
  tar czf $OUT/needle.tgz out-needle/needle/*/ckpt.pt out-needle/needle/*/log.txt
else
  tar xzf .gpu/needle.tgz
fi
timeout $(( ${BUDGET:-570} - $(el) - 10 )) python tools/longctx.py needle out-needle/needle/* --scales ${SCALES:-1 16 64} \
  --depths 0 0.5 1 --sequences ${SEQ:-32} --by_depth 2>&1 | grep -v Warn | tee $OUT/needle-long.txt
echo "done at $(el) s"
