"""What train.py, evaluate.py and rank.py share: config, checkpoints, model loading, evaluation."""
