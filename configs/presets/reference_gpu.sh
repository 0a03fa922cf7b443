# shellcheck shell=bash
# The reference 8-GPU run: BERT-Large, seq 512, LAMB (mlcommons/training
# retired_benchmarks/bert/README.md, "On GPU-V100-8").
# --train_batch_size is the global batch of one micro-step across all ranks.
PRESET_NUM_GPUS=8
PRESET_BERT_CONFIG=configs/bert_config_large.json
PRESET_FLAGS=(
  --max_seq_length=512
  --max_predictions_per_seq=76
  --train_batch_size=24
  --learning_rate=1e-4
  --optimizer=lamb
  --dtype=bf16
  --num_train_steps=107538
  --num_warmup_steps=1562
  --start_warmup_step=0
  --save_checkpoints_steps=6250
  --eval_batch_size=8
  --max_eval_steps=1250
  --target_mlm_accuracy=0.720
  --submission_division=closed
)
