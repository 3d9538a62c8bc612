"""What train.py, evaluate.py and rank.py share: config, checkpoints, model loading, evaluation; and
the set-up and stopping of a training run around train.py's algorithm (training_run.py)."""
