#!/usr/bin/env bash
# Alternating rounds: every trainer once per round, the order rotated each round, so that a change in the
# machine's load hits them all alike; then the summary with same-round ratios.
#   ROUNDS=2 TRAINERS="dl-new dl-main speculators specforge" bench/peers/rounds.sh
# dl-<label> is draftlab from the tree in $DL_TREE_<label> (e.g. DL_TREE_new=/work/wt/peers); see run.sh.
set -u
here=$(cd "$(dirname "$0")" && pwd)
read -r -a trainers <<< "${TRAINERS:-dl-new speculators specforge}"
n=${#trainers[@]}
for round in $(seq "${FIRST_ROUND:-1}" "${ROUNDS:-2}"); do
  for i in $(seq 0 $((n - 1))); do
    t=${trainers[$(((i + round - 1) % n))]}
    case $t in
      dl-*) tree_var="DL_TREE_${t#dl-}"; DL_TREE=${!tree_var} "$here/run.sh" draftlab "r$round-$t" ;;
      *) "$here/run.sh" "$t" "r$round-$t" ;;
    esac
    echo "round $round $t rc=$(cat "$RESULTS/r$round-$t/rc") $(tail -1 "$RESULTS/r$round-$t/load.txt")"
  done
done
python3 "$here/summary.py" "$RESULTS" "$PEERS/data/split.json"
