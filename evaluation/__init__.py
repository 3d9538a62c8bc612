"""How a trained model is scored: what evaluate.py (and rank.py, report.py, training's
validation) is built from.

    loop.py      the perplexity loop: a split in bptt chunks, the NLL summed on the device
    cache.py     the neural cache of Grave et al. 2017 ([Cache], AWD-LSTM's pointer.py)
    dynamic.py   dynamic evaluation of Krause et al. 2018 ([DynEval], the MoS code's version)

They depend on the model's interface and data/batching only, never on the run infrastructure
of experiment/ (config, checkpoints, run directories), which depends on them.
"""
