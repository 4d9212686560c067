#!/usr/bin/env bash
# One timed training run of one trainer on the converted data: 1 epoch, 1 layer, draft vocab 8192, TTT 3, fp32,
# lr 1e-3 cosine with 5% warmup, ~512 tokens per step.
#   bench/peers/run.sh draftlab|speculators|specforge NAME
# Writes $RESULTS/NAME/: timing.json (timing.py), time.txt (/usr/bin/time -v), log.txt, load.txt (uptime
# before and after), rc. Environment: PEERS (venvs + data from convert.py), RESULTS, THREADS (default 1);
# for draftlab also DL_TREE (the checkout to measure), DL_ROOT (its paths.root, holding the extract pool) and
# DL_PYTHON (default: DL_TREE's .venv).
set -u
trainer=$1 name=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$RESULTS/$name
rm -rf "$out" && mkdir -p "$out"
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} CPU_PEERS_TIMING=$out/timing.json
data=$PEERS/data
ratio=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['train_ratio'])" "$data/split.json")
timed=(/usr/bin/time -v -o "$out/time.txt")
uptime > "$out/load.txt"
case $trainer in
  draftlab)
    rm -rf "$DL_ROOT/train" "$DL_ROOT/train.lock"
    (cd "$DL_TREE" && PYTHONPATH="$DL_TREE/src" "${timed[@]}" "${DL_PYTHON:-$DL_TREE/.venv/bin/python}" \
      "$here/draftlab_timed.py" 'stages=[train]' data.samples=240 data.max_new_tokens=96 train.epochs=1 \
      train.max_steps=null train.early_stop_patience=null \
      train.ttt_steps=3 train.batch_tokens=512 train.lr=1e-3 train.schedule=cosine train.warmup_ratio=0.05 \
      train.dtype=float32 train.device=cpu paths.root="$DL_ROOT" tracking.uri="sqlite:///$DL_ROOT/mlflow.db" \
      tracking.experiment=cpu-peers hydra.run.dir="$out/hydra") > "$out/log.txt" 2>&1 ;;
  speculators)
    (cd "$out" && "${timed[@]}" "$PEERS/venv-spec/bin/python" "$here/speculators_timed.py" train \
      --speculator-type eagle3 --verifier-name-or-path "$data/target" --data-path "$data/spec" --on-missing raise \
      --target-layer-ids 2 15 27 --num-layers 1 --draft-vocab-size 8192 --total-seq-len 512 \
      --train-data-ratio "$ratio" --num-workers 0 --epochs 1 --ttt-steps 3 --ttt-step-loss-decay 0.8 \
      --optimizer adamw --lr 1e-3 --scheduler-type cosine --scheduler-warmup-ratio 0.05 \
      --hidden-states-dtype float32 --draft-attn-impl sdpa --loss-implementation eager --log-freq 10 --seed 0 \
      --save-path "$out/ckpt" --log-dir "$out/logs" --no-resume-from-checkpoint) > "$out/log.txt" 2>&1 ;;
  specforge)
    # batch_size 3: about as many steps of about as many tokens as the others (SpecForge pads, never packs);
    # no eval data: SpecForge then runs no evaluation (the others validate outside the timed loop or subtract it)
    cat > "$out/sf.yaml" <<YAML
model: {target_model_path: $data/target, draft_model_config: $data/sf/draft_config.json,
  embedding_key: model.embed_tokens.weight, lm_head_key: lm_head.weight, torch_dtype: float32,
  vocab_mapping_path: $data/sf/vocab_mapping.pt}
data: {hidden_states_path: $data/sf/train, max_length: 2048,
  chat_template: llama3, cache_dir: $out/cache, dataloader_num_workers: 0}
training: {strategy: eagle3, num_epochs: 1, batch_size: 3, learning_rate: 1.0e-3, lr_scheduler: cosine,
  warmup_ratio: 0.05, max_grad_norm: 0.5, ttt_length: 3, attention_backend: sdpa, fsdp_sharding: NO_SHARD,
  save_interval: 0, eval_interval: 0, log_interval: 10, seed: 0}
deployment: {mode: local_colocated}
run_id: $name
output_dir: $out/sf-out
YAML
    (cd "$out" && "${timed[@]}" "$PEERS/venv-sf/bin/python" "$here/specforge_timed.py" train --config "$out/sf.yaml") \
      > "$out/log.txt" 2>&1 ;;
  *) echo "unknown trainer $trainer (draftlab|speculators|specforge)" >&2; exit 2 ;;
esac
echo $? > "$out/rc"
uptime >> "$out/load.txt"
rm -rf "$out/ckpt" "$out/sf-out" "$out/cache"
