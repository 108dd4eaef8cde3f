# issue 19 (m): documents on / off, whole-model training at T 4096 (bench.py --train --documents)
export PYTHONUNBUFFERED=1
timeout 580 python3 bench.py --train --documents --contexts 4096 --jobs 3 --mixers "$@" --json $OUT/train.json 2>&1 | tee $OUT/train.txt
