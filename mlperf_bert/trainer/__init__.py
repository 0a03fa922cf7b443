"""The trainer: BERT, LAMB, the schedule, TF checkpoints, the input pipeline and the training loop."""
