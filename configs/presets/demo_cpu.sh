# shellcheck shell=bash
# The built-in demo: a tiny BERT on one CPU process, LAMB with gradient accumulation
# (global batch 32 = 16 x 2), online eval every 1,600 samples (the rules' formula gives 150,000, after
# this run's 32,000), open division with a target it can reach.
PRESET_NUM_GPUS=1
# one thread unless OMP_NUM_THREADS is set: the tiny model gains nothing from a second, and threads that
# wait for each other are what load elsewhere on the machine costs most (docs/running.md, "Threads")
PRESET_THREADS=1
PRESET_BERT_CONFIG=configs/bert_config_demo.json
PRESET_FLAGS=(
  --max_seq_length=32
  --max_predictions_per_seq=5
  --train_batch_size=16
  --steps_per_update=2
  --learning_rate=2e-2
  --optimizer=lamb
  --num_train_steps=2000
  --num_warmup_steps=20
  --start_warmup_step=0
  --save_checkpoints_steps=2500
  --eval_batch_size=128
  --max_eval_steps=8
  --eval_frequency=1600
  --target_mlm_accuracy=0.14
  --submission_division=open
)
