#!/bin/bash
# cold then three warm, for each torch; one process a run
cd /work/main
for py in .venv/bin/python /tmp/t211/bin/python; do
  tag=$(basename $(dirname $(dirname $py)))
  rm -rf /tmp/ctime/ind_$tag
  for r in cold warm1 warm2 warm3; do
    TORCHINDUCTOR_CACHE_DIR=/tmp/ctime/ind_$tag $py bench/compile_time.py --backend inductor 2>/tmp/ctime/err_${tag}_$r.txt | sed "s/^{/{\"run\": \"$r\", /" >> /tmp/ctime/compile_phases.jsonl
  done
done
echo done > /tmp/ctime/DONE
