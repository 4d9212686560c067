# Sourced by run.sh and rounds.sh: the device, and the settings every trainer shares, from the environment.
# DEVICE cpu | cuda (default cuda when nvidia-smi lists a GPU); on cuda: TTT 7, 16,384 tokens a step, 4 data workers
# for the peers; on cpu: TTT 3, 512 tokens, none. LR 1e-3, MAX_SEQ 2048, EPOCHS 1 either way.
if [ -z "${DEVICE:-}" ]; then
  DEVICE=cpu
  nvidia-smi -L > /dev/null 2>&1 && DEVICE=cuda
fi
if [ "$DEVICE" = cuda ]; then
  TTT=${TTT:-7} BATCH_TOKENS=${BATCH_TOKENS:-16384} WORKERS=${WORKERS:-4}
else
  TTT=${TTT:-3} BATCH_TOKENS=${BATCH_TOKENS:-512} WORKERS=${WORKERS:-0}
fi
LR=${LR:-1e-3} MAX_SEQ=${MAX_SEQ:-2048} EPOCHS=${EPOCHS:-1}
export DEVICE TTT BATCH_TOKENS WORKERS LR MAX_SEQ EPOCHS
