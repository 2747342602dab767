# Two builds alternated: bash ab.sh BEFORE_DIR AFTER_DIR BATCH THREADS POLICY REPEATS ROUNDS, each
# DIR holding a beaconkv package with its extension (PYTHONPATH=DIR).
here=$(dirname "$0")
for r in $(seq 1 "$7"); do
  for d in "$1" "$2"; do
    TAG=$(basename "$d") PYTHONPATH="$d" python3 "$here/one_run.py" "$3" "$4" "$5" "$6"
  done
done
