"""The run infrastructure train.py, evaluate.py and rank.py share: the config, checkpoints, model
loading, the run directory and its lock, progress and logs, averaged SGD, DDP, and the set-up and
stopping of a training run around train.py's algorithm (training_run.py). How a model is scored
(the perplexity loop, the neural cache, dynamic evaluation) is the evaluation/ package."""
