# the long-context decode table (one call per few mixers: a cell's row is printed as soon as it is measured, so a cut
# call keeps its rows): MIXERS="'kda*3,softmax' kda" CONTEXTS="4096 131072 1048576" [BATCHES="1 max"] bash .gpu/callL.sh
t0=$(date +%s); source .gpu/setup.sh
eval "set -- ${MIXERS:-'kda*3,softmax' kda}"
timeout $(( ${BUDGET:-570} - $(el) - 10 )) python tools/bench_decode.py --mixers "$@" \
  --contexts ${CONTEXTS:-4096 32768 131072 524288 1048576} --batches ${BATCHES:-1 max} --json $OUT/decode.json 2>&1 \
  | grep -vi warn | tee $OUT/bench-decode.txt
echo "done at $(el) s"
