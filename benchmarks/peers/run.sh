#!/usr/bin/env bash
# One timed training run of one trainer on convert.py's data: EPOCHS (1) over the same training samples, 1 draft
# layer of the same shape, the same draft vocabulary, TTT length, step-loss decay 0.8, lr (cosine, 5% warmup),
# tokens per step and longest sequence.
#   benchmarks/peers/run.sh draftlab|speculators|specforge NAME
# Writes $RESULTS/NAME/: timing.json (timing.py), wall.txt (the whole command, load and compile included),
# time.txt (/usr/bin/time -v, where it exists), smi.txt (nvidia-smi's memory.used every 0.5 s, on a GPU),
# log.txt, load.txt (load average before and after), rc, and the trained draft for val_loss.py.
# Environment:
#   DATA     convert.py's OUT (default $PEERS/data); RESULTS: where runs go
#   DEVICE, TTT, BATCH_TOKENS, LR, MAX_SEQ, WORKERS, EPOCHS: settings.sh. On cuda the trainers run as released, bf16;
#            on cpu in fp32 with the CPU patches in *_timed.py. THREADS (cpu threads, default 1), PROFILE_STEP
#   SEED     every trainer's seed (default 0)
#   DL_TREE  the draftlab checkout to measure; DL_PYTHON its interpreter (default DL_TREE's .venv, else python3);
#            DL_ARGS more overrides of its train stage (whitespace-separated); its head is frozen as speculators'
#            is (train.freeze_lm_head=true) unless DL_ARGS sets it
#   SPEC_PYTHON, SF_PYTHON  the peers' interpreters (default $PEERS/venv-spec, $PEERS/venv-sf); PEERS_SITE is put
#            first on the peers' PYTHONPATH (the GPU machine's wheels), DL_SITE on draftlab's
set -u
trainer=$1 name=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$RESULTS/$name
rm -rf "$out" && mkdir -p "$out"
data=${DATA:-$PEERS/data}
. "$here/settings.sh"
split() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))" \
  "$data/split.json" "$1"; }
ttt=$TTT batch=$BATCH_TOKENS workers=$WORKERS lr=$LR max_seq=$MAX_SEQ dtype=float32 seed=${SEED:-0} epochs=$EPOCHS
# draftlab validates once, at the end, as over one epoch: over more, its per-epoch passes would let it export the
# best epoch by the very samples val_loss.py scores, where the peers give their last weights
dl_eval=null; [ "$epochs" -gt 1 ] && dl_eval=1000000
[ "$DEVICE" = cuda ] && dtype=bfloat16
n=$(split n) vocab=$(split draft_vocab) ratio=$(split train_ratio) extract=$(split extract) pad=$(split pad_token_id)
layers=$(split "' '.join(map(str, hf_layer_ids))")
# SpecForge pads each batch to its longest sample and never packs: as many samples a step as fill the budget
sf_batch=$(split "max(1, round($batch / (train_tokens / n_train)))")
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} PEERS_TIMING=$out/timing.json
export PEERS_PROFILE_STEP=${PROFILE_STEP:-0} PEERS_PROFILE_OUT=$out/profile.txt PYTHONUNBUFFERED=1
[ "$DEVICE" = cpu ] && export CUDA_VISIBLE_DEVICES="" PEERS_FP32=1
echo "$trainer device=$DEVICE ttt=$ttt batch_tokens=$batch lr=$lr max_seq=$max_seq specforge_batch=$sf_batch" \
  "epochs=$epochs seed=$seed" \
  > "$out/settings.txt"
timed=()
[ -x /usr/bin/time ] && timed=(/usr/bin/time -v -o "$out/time.txt")
cat /proc/loadavg > "$out/load.txt"
smi=""
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/smi.txt" 2>/dev/null &
  smi=$!
fi
start=$(date +%s.%N)
case $trainer in
  draftlab)
    hw=cpu; [ "$DEVICE" = cuda ] && hw=gpu
    py=${DL_PYTHON:-$DL_TREE/.venv/bin/python}; [ -x "$py" ] || py=python3
    read -r -a extra <<< "${DL_ARGS:-}"
    # speculators keeps its head at the target's rows: draftlab too, where its tree has the setting and DL_ARGS
    # does not set it
    if grep -q '^freeze_lm_head:' "$DL_TREE/conf/train/default.yaml" 2>/dev/null \
        && [[ " ${DL_ARGS:-} " != *" train.freeze_lm_head="* ]]; then
      extra=(train.freeze_lm_head=true "${extra[@]}")
    fi
    echo "draftlab overrides: ${extra[*]}" >> "$out/settings.txt"
    (cd "$DL_TREE" && PYTHONPATH="$DL_TREE/src${DL_SITE:+:$DL_SITE}" "${timed[@]}" "$py" "$here/draftlab_timed.py" \
      "$extract" "$out/dl" hardware=$hw data.samples="$n" draft.vocab_size="$vocab" train.epochs="$epochs" \
      train.max_steps=null train.early_stop_patience=null train.eval_every=$dl_eval train.checkpoint_every=1000000 \
      train.ttt_steps="$ttt" train.loss_decay=0.8 train.batch_tokens="$batch" train.max_seq_len="$max_seq" \
      train.lr="$lr" train.schedule=cosine train.warmup_ratio=0.05 train.seed="$seed" train.device="$DEVICE" \
      train.dtype="$dtype" "${extra[@]}") > "$out/log.txt" 2>&1 ;;
  speculators)
    # its eagle3 defaults add three norms (before fc, before the residual, on the fed-back state) and a 2048
    # sliding window: turned off, so that all three train the graph SGLang serves (and val_loss.py can load it)
    flags=(--no-norm-before-residual --no-norm-before-fc --no-norm-output --full-attention-indices 0)
    [ "$DEVICE" = cpu ] && flags+=(--draft-attn-impl sdpa)
    # its fused Triton loss fails under torch.compile on torch 2.11 ("ListVariable ... is already tracked for
    # mutation": its two kernels share one autotune config list); the eager loss is compiled into the forward
    flags+=(--loss-implementation eager)
    (cd "$out" && PYTHONPATH="${PEERS_SITE:-}" "${timed[@]}" "${SPEC_PYTHON:-$PEERS/venv-spec/bin/python}" \
      "$here/speculators_timed.py" train --speculator-type eagle3 --verifier-name-or-path "$data/target" \
      --data-path "$data/spec" --on-missing raise --target-layer-ids $layers --num-layers 1 \
      --draft-vocab-size "$vocab" --mask-token-id "$pad" --total-seq-len "$batch" --train-data-ratio "$ratio" \
      --num-workers "$workers" --epochs "$epochs" --ttt-steps "$ttt" --ttt-step-loss-decay 0.8 --optimizer adamw \
      --lr "$lr" --weight-decay 0 --scheduler-type cosine --scheduler-warmup-ratio 0.05 \
      --hidden-states-dtype "$dtype" "${flags[@]}" --log-freq 10 --seed "$seed" --save-path "$out/ckpt" \
      --log-dir "$out/logs" --no-resume-from-checkpoint) > "$out/log.txt" 2>&1 ;;
  specforge)
    # no eval data: SpecForge then runs no evaluation (val_loss.py scores every draft on the same samples)
    attention=sdpa; [ "$DEVICE" = cuda ] && attention=${SF_ATTENTION:-flex_attention}
    cat > "$out/sf.yaml" <<YAML
model: {target_model_path: $data/target, draft_model_config: $data/sf/draft_config.json,
  embedding_key: model.embed_tokens.weight, lm_head_key: lm_head.weight, torch_dtype: $dtype,
  vocab_mapping_path: $data/sf/vocab_mapping.pt}
data: {hidden_states_path: $data/sf/train, max_length: $max_seq,
  chat_template: llama3, cache_dir: $out/cache, dataloader_num_workers: $workers}
training: {strategy: eagle3, num_epochs: $epochs, batch_size: $sf_batch, learning_rate: $lr, lr_scheduler: cosine,
  warmup_ratio: 0.05, max_grad_norm: 0.5, ttt_length: $ttt, attention_backend: $attention,
  fsdp_sharding: NO_SHARD, save_interval: 0, eval_interval: 0, log_interval: 10, seed: $seed}
deployment: {mode: local_colocated}
run_id: $name
output_dir: $out/sf-out
YAML
    (cd "$out" && PYTHONPATH="${PEERS_SITE:-}" PEERS_DRAFT_OUT="$out/draft.safetensors" "${timed[@]}" \
      "${SF_PYTHON:-$PEERS/venv-sf/bin/python}" "$here/specforge_timed.py" train --config "$out/sf.yaml") \
      > "$out/log.txt" 2>&1 ;;
  *) echo "unknown trainer $trainer (draftlab|speculators|specforge)" >&2; exit 2 ;;
esac
echo $? > "$out/rc"
python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 3))" "$start" "$(date +%s.%N)" \
  > "$out/wall.txt"
[ -n "$smi" ] && kill "$smi" 2> /dev/null
cat /proc/loadavg >> "$out/load.txt"
# only the trained draft stays: val_loss.py reads it after the rounds
rm -rf "$out/dl/checkpoints" "$out/sf-out" "$out/cache"
find "$out/ckpt" -mindepth 2 -type f ! -name model.safetensors ! -name config.json -delete 2> /dev/null
exit 0
