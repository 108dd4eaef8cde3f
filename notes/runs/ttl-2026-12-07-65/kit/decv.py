# bench_decode with the decode step's V-tile set: python .gpu/decv.py 128|auto|N [bench_decode args]
import os, sys
sys.path[:0] = ['.', 'tools']
import kernels
v = sys.argv.pop(1)
kernels.TUNING['step']['decode_v'] = None if v == 'auto' else int(v)
print(f"decode_v = {kernels.TUNING['step']['decode_v']}")
import bench_decode
sys.argv[0] = 'tools/bench_decode.py'
bench_decode.main()
