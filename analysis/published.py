"""The numbers [SB] publishes, in one place: what report.py prints and draws beside the measured ones.

[SB] Parthiban, Mao, Inkpen. On the Softmax Bottleneck of Recurrent Language Models. AAAI 2021,
and its supplementary material (SM). Every value below is as printed there (the table, figure or
page is named at each entry); nothing is derived. Parameter counts are kept as the printed strings
(millions truncated to two decimals); ± values are one standard deviation over seeds (10 or 11,
see the table's note); values without one are single runs.

A published table row names the runs it compares with by their dataset, head and `setting`: the
config keys and values that select them (for example MoS† is `model.emsize = 280,
model.nhidlast = 280`). The ASGD trigger is part of the setting wherever [SB] says or the numbers
show which one was used, so that an ET-ASGD run is never set beside an NT-ASGD number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .runs import head_label

DATASET_LABELS = {"ptb": "PTB", "wikitext-2": "WikiText-2"}


def dataset_label(dataset: str) -> str:
    return DATASET_LABELS.get(dataset, dataset)


@dataclass(frozen=True)
class Stat:
    mean: float
    std: float | None = None          # one standard deviation over seeds; None: a single run


@dataclass(frozen=True)
class PublishedRow:
    label: str                        # the paper's name for the row, e.g. "MoS†", "K = 5"
    dataset: str                      # data.dataset of the runs: "ptb" or "wikitext-2"
    head: str                         # head.name of the runs
    setting: dict = field(default_factory=dict)   # further config keys -> values of the runs
    params: str | None = None         # as printed, e.g. "17.53M"
    seconds: float | None = None      # "~55s" per epoch (one V100)
    train_ppl: Stat | None = None
    val_ppl: Stat | None = None
    test_ppl: Stat | None = None
    p_value: float | None = None      # t-test of test ppl against the table's baseline row
    press_rank: Stat | None = None
    source: str = ""                  # where in [SB] the numbers are printed
    # [SB] Table 6: the epsilon-effective ranks of the test log-P for epsilon = 1e-3, 1e-4, 1e-5
    effective_rank_e3: Stat | None = None
    effective_rank_e4: Stat | None = None
    effective_rank_e5: Stat | None = None


@dataclass(frozen=True)
class PublishedTable:
    name: str                         # what `report.py table --paper NAME` takes
    title: str
    group_by: tuple[str, ...]         # the config keys its rows differ in (beyond dataset and head)
    columns: tuple[str, ...]          # the paper's columns, in its order (names of tables.COLUMNS)
    rows: tuple[PublishedRow, ...]
    baseline: str | None = None       # label of the row p-values compare against (per dataset)
    note: str = ""

    def row_for(self, dataset: str, head: str, values: dict) -> PublishedRow | None:
        """The published row of these runs: same dataset and head, and every key of its setting
        equal to the runs' config value (`values`: key -> value)."""
        for row in self.rows:
            if row.dataset == dataset and row.head == head and all(
                    same_value(values.get(key), value) for key, value in row.setting.items()):
                return row
        return None


def same_value(a, b) -> bool:
    """Config values compare as numbers when both are (0.29 from YAML equals 0.29 here)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)          # relative: c values go down to 1e-32
    return a == b


def pm(mean: float, std: float | None = None) -> Stat:
    return Stat(mean, std)


ET = {"train.asgd_trigger": "et"}
NT = {"train.asgd_trigger": "nt"}

# ---------------------------------------------------------------- [SB] Table 2 (+ Table 3, MoC)

TABLE2 = PublishedTable(
    name="table2",
    title="[SB] Table 2: heads on the same AWD-LSTM body, ET-ASGD at epoch 200",
    group_by=("train.asgd_trigger",),
    columns=("params", "seconds", "train_ppl", "val_ppl", "test_ppl", "p_value", "press_rank", "runs"),
    baseline="Softmax",
    note="[SB]: mean ± std over 11 seeds (the authors' seed and 10 others); p-values over the 10 "
         "others only. LMS-PLIF† is [SB] Table 3 (no p-value against Softmax published). MoC is "
         "one ET-ASGD run, [SB] SM Tables 10/11.",
    rows=(
        PublishedRow("Softmax", "ptb", "softmax", ET, "24.22M", 55, pm(33.91, 0.25), pm(59.55, 0.12),
                     pm(57.08, 0.09), None, pm(402, 0), source="Table 2"),
        PublishedRow("SS", "ptb", "ss", ET, "24.22M", 57, pm(32.87, 0.19), pm(59.69, 0.15),
                     pm(57.05, 0.15), 3.92e-1, pm(5113, 85), source="Table 2"),
        PublishedRow("GSS", "ptb", "gss", ET, "24.22M", 58, pm(33.68, 0.32), pm(59.51, 0.13),
                     pm(57.00, 0.14), 2.62e-1, pm(8904, 57), source="Table 2"),
        PublishedRow("LMS-PLIF", "ptb", "plif", ET, "24.32M", 59, pm(36.67, 0.30), pm(59.08, 0.09),
                     pm(56.80, 0.11), 1.91e-5, pm(496, 83), source="Table 2"),
        PublishedRow("LMS-PLIF†", "ptb", "plif_frozen", ET, None, None, pm(37.16, 0.24), pm(59.23, 0.11),
                     pm(56.83, 0.10), source="Table 3"),
        PublishedRow("MoS", "ptb", "mos", ET, "21.50M", 100, pm(31.84, 0.23), pm(57.14, 0.26),
                     pm(54.91, 0.26), 2.02e-15, pm(9981, 2), source="Table 2"),
        PublishedRow("MoC", "ptb", "moc", ET, "21.50M", None, pm(31.37), pm(58.38), pm(55.81), None,
                     pm(282), source="SM Table 10"),
        PublishedRow("Softmax", "wikitext-2", "softmax", ET, "33.55M", 72, pm(39.32, 0.14),
                     pm(67.57, 0.14), pm(64.63, 0.08), None, pm(402, 0), source="Table 2"),
        PublishedRow("SS", "wikitext-2", "ss", ET, "33.55M", 83, pm(39.29, 0.17), pm(67.28, 0.16),
                     pm(64.35, 0.17), 3.46e-4, pm(6634, 46), source="Table 2"),
        PublishedRow("GSS", "wikitext-2", "gss", ET, "33.55M", 87, pm(39.42, 0.41), pm(67.35, 0.22),
                     pm(64.50, 0.13), 2.74e-2, pm(10122, 72), source="Table 2"),
        PublishedRow("LMS-PLIF", "wikitext-2", "plif", ET, "33.65M", 93, pm(41.13, 0.15),
                     pm(67.15, 0.21), pm(64.16, 0.17), 2.98e-7, pm(524, 74), source="Table 2"),
        PublishedRow("LMS-PLIF†", "wikitext-2", "plif_frozen", ET, None, None, pm(41.67, 0.15),
                     pm(67.22, 0.13), pm(64.28, 0.17), source="Table 3"),
        PublishedRow("MoS", "wikitext-2", "mos", ET, "34.90M", 600, pm(36.17, 0.30), pm(64.54, 0.36),
                     pm(61.96, 0.40), 2.04e-13, pm(15734, 188), source="Table 2"),
        PublishedRow("MoC", "wikitext-2", "moc", ET, "34.90M", None, pm(37.23), pm(68.19), pm(65.83),
                     None, pm(302), source="SM Table 11"),
    ),
)

# ---------------------------------------------------------------- [SB] SM Tables 10 and 11

def _nt_et_rows(dataset: str, source: str, params: dict, numbers: dict) -> tuple[PublishedRow, ...]:
    rows = []
    for trigger, setting in (("nt", NT), ("et", ET)):
        for head, (train, val, test, rank) in numbers[trigger].items():
            rows.append(PublishedRow(f"{head_label(head)}, {trigger.upper()}-ASGD", dataset, head, setting,
                                     params[head], None, pm(train), pm(val), pm(test), None, pm(rank),
                                     source=source))
    return tuple(rows)


_PTB_PARAMS = {"softmax": "24.22M", "ss": "24.22M", "gss": "24.22M", "plif": "24.32M",
               "mos": "21.50M", "moc": "21.50M"}
_WT2_PARAMS = {"softmax": "33.55M", "ss": "33.55M", "gss": "33.55M", "plif": "33.65M",
               "mos": "34.90M", "moc": "34.90M"}

SM_TABLES_10_11 = PublishedTable(
    name="sm-tables10-11",
    title="[SB] SM Tables 10/11: NT-ASGD (non-monotone interval 5) against ET-ASGD (epoch 200)",
    group_by=("train.asgd_trigger",),
    columns=("params", "train_ppl", "val_ppl", "test_ppl", "press_rank", "runs"),
    note="[SB]: one run per row.",
    rows=_nt_et_rows("ptb", "SM Table 10", _PTB_PARAMS, {     # train, valid, test ppl, Press rank
        "nt": {"softmax": (34.05, 60.35, 58.07, 402), "ss": (33.68, 60.45, 57.75, 4906),
               "gss": (34.24, 59.95, 57.60, 8276), "plif": (37.19, 60.86, 58.45, 510),
               "mos": (33.08, 58.21, 56.07, 9979), "moc": (33.73, 59.84, 57.40, 282)},
        "et": {"softmax": (34.03, 59.48, 57.10, 402), "ss": (32.83, 59.95, 57.16, 4979),
               "gss": (34.21, 59.37, 56.78, 8989), "plif": (37.07, 59.08, 56.67, 580),
               "mos": (31.62, 57.12, 55.11, 9983), "moc": (31.37, 58.38, 55.81, 282)},
    }) + _nt_et_rows("wikitext-2", "SM Table 11", _WT2_PARAMS, {
        "nt": {"softmax": (39.07, 68.35, 65.28, 402), "ss": (39.21, 67.84, 65.08, 5879),
               "gss": (39.05, 67.72, 65.07, 9130), "plif": (41.11, 68.54, 65.59, 479),
               "mos": (35.92, 65.93, 63.06, 13215), "moc": (37.21, 69.08, 66.42, 302)},
        "et": {"softmax": (39.09, 67.59, 64.56, 402), "ss": (39.19, 67.19, 64.33, 6590),
               "gss": (39.12, 66.97, 64.38, 10145), "plif": (41.19, 67.19, 64.32, 513),
               "mos": (35.99, 64.58, 61.90, 15738), "moc": (37.23, 68.19, 65.83, 302)},
    }),
)

# ---------------------------------------------------------------- [SB] Table 5

TABLE5 = PublishedTable(
    name="table5",
    title="[SB] Table 5: fair comparison of MoS and Softmax on PTB (batch 12, nhid 960, d' = d)",
    group_by=("model.emsize", "model.nhidlast"),
    columns=("params", "train_ppl", "val_ppl", "test_ppl", "p_value", "runs"),
    baseline="Softmax‡",
    note="[SB]: mean ± std over 10 seeds; the p-value (0.62, p. 7) is MoS† against Softmax‡. "
         "Softmax† has only its parameter count in the paper (p. 7). [SB] does not say which "
         "ASGD trigger these runs used.",
    rows=(
        PublishedRow("MoS†", "ptb", "mos", {"model.emsize": 280, "model.nhidlast": 280}, "17.53M",
                     None, pm(42.45, 1.03), pm(58.53, 0.17), pm(56.39, 0.19), 0.62, source="Table 5"),
        PublishedRow("Softmax†", "ptb", "softmax", {"model.emsize": 280, "model.nhidlast": 280},
                     "16.35M", source="p. 7"),
        PublishedRow("Softmax‡", "ptb", "softmax", {"model.emsize": 340, "model.nhidlast": 340},
                     "17.56M", None, pm(40.87, 0.18), pm(58.61, 0.10), pm(56.45, 0.10), source="Table 5"),
    ),
)

# ---------------------------------------------------------------- [SB] SM Tables 4, 5 and 12

# These are NT-ASGD runs: their K = 15 / dropoutl = 0.29 rows repeat the NT-ASGD MoS of SM
# Tables 10/11 (PTB train 33.08, test 56.07, rank 9,979; WT2 test 63.06).
_MOS_NOTE = ("[SB]: one NT-ASGD run per row (the K = 15, dropoutl = 0.29 row is the NT-ASGD MoS of "
             "SM Tables 10/11, with the same numbers on PTB; on WikiText-2 [SB] prints that run's "
             "Press rank as 13,229 in SM Table 5 and its train ppl as 39.11 in SM Table 12, against "
             "13,215 and 35.92 in SM Table 11); rows trained with another trigger have no published "
             "counterpart.")


def _mos_row(source, label, dataset, components, dropoutl, params, train, test, rank) -> PublishedRow:
    setting = {"head.components": components, "head.dropoutl": dropoutl, **NT}
    return PublishedRow(label, dataset, "mos", setting, params, None, pm(train), None, pm(test),
                        None, pm(rank), source=source)


SM_TABLES_4_5 = PublishedTable(
    name="sm-tables4-5",
    title="[SB] SM Tables 4 (PTB) and 5 (WikiText-2): MoS with K mixture components",
    group_by=("head.components", "head.dropoutl", "train.asgd_trigger"),
    columns=("params", "train_ppl", "test_ppl", "press_rank", "runs"),
    note=_MOS_NOTE,
    rows=tuple(_mos_row("SM Table 4", f"K = {k}", "ptb", k, 0.29, params, train, test, rank)
               for k, params, train, test, rank in (
                   (1, "19.05M", 56.42, 64.50, 282), (3, "19.40M", 41.77, 59.25, 5575),
                   (5, "19.75M", 38.09, 58.38, 8057), (10, "20.62M", 35.48, 56.21, 9976),
                   (15, "21.50M", 33.08, 56.07, 9979), (20, "22.37M", 32.19, 56.19, 9980)))
    + tuple(_mos_row("SM Table 5", f"K = {k}", "wikitext-2", k, 0.29, params, train, test, rank)
            for k, params, train, test, rank in (
                (10, "33.92M", 36.94, 63.62, 12198), (15, "34.90M", 35.92, 63.06, 13229),
                (20, "35.88M", 35.35, 62.76, 13998))),
)

SM_TABLE12 = PublishedTable(
    name="sm-table12",
    title="[SB] SM Table 12: MoS (K = 15) with the dropout on its latent vectors (dropoutl) lowered",
    group_by=("head.components", "head.dropoutl", "train.asgd_trigger"),
    columns=("train_ppl", "test_ppl", "press_rank", "runs"),
    note=_MOS_NOTE,
    rows=tuple(_mos_row("SM Table 12", f"dropoutl = {p:g}", dataset, 15, p, None, train, test, rank)
               for dataset, p, train, test, rank in (
                   ("ptb", 0.29, 33.08, 56.07, 9979), ("ptb", 0.145, 29.21, 59.09, 9985),
                   ("ptb", 0.0, 23.81, 64.82, 9992), ("wikitext-2", 0.29, 39.11, 63.06, 13215),
                   ("wikitext-2", 0.145, 32.19, 64.38, 17256), ("wikitext-2", 0.0, 27.51, 68.49, 19427))),
)

# ---------------------------------------------------------------- [SB] Table 6 (SM Tables 17 and 18)

def _effective_rank_rows(dataset: str, source: str, numbers: dict) -> tuple[PublishedRow, ...]:
    return tuple(PublishedRow(head_label(head), dataset, head, ET, press_rank=pm(press),
                              effective_rank_e3=pm(e3), effective_rank_e4=pm(e4), effective_rank_e5=pm(e5),
                              source=source)
                 for head, (press, e3, e4, e5) in numbers.items())


TABLE6 = PublishedTable(
    name="table6",
    title="[SB] Table 6 (SM Tables 17/18): Press rank and epsilon-effective ranks of the test log-P",
    group_by=("train.asgd_trigger",),
    columns=("press_rank", "effective_rank_e3", "effective_rank_e4", "effective_rank_e5", "runs"),
    note="[SB]: one run per row, the ET-ASGD run with the authors' seed (its Press rank is SM Tables "
         "10/11's ET-ASGD column); PTB over every test context, WikiText-2 over the first 33,320. The "
         "epsilon-effective rank: the fewest singular values whose squares sum to at least 1 - epsilon "
         "of all squares.",
    rows=_effective_rank_rows("ptb", "Table 6, SM Table 17", {     # Press rank, eps 1e-3, 1e-4, 1e-5
        "softmax": (402, 52, 201, 306), "ss": (4979, 100, 297, 1038), "gss": (8989, 100, 559, 3456),
        "plif": (580, 50, 198, 335), "mos": (9983, 81, 1521, 6428)})
    + _effective_rank_rows("wikitext-2", "Table 6, SM Table 18", {
        "softmax": (402, 27, 141, 274), "ss": (6590, 54, 249, 1201), "gss": (10145, 60, 391, 2988),
        "plif": (513, 29, 150, 287), "mos": (15738, 49, 773, 5982)}),
)

PUBLISHED_TABLES = {t.name: t for t in (TABLE2, SM_TABLES_10_11, TABLE5, SM_TABLES_4_5, SM_TABLE12, TABLE6)}

# ---------------------------------------------------------------- [SB] Figure 2: the GSS grid


@dataclass(frozen=True)
class GridCorrelation:
    c: tuple[float, ...]              # the grid of GSS(c, k) trained
    k: tuple[float, ...]
    pearson_r: float                  # Press rank against test ppl over the whole grid
    ppl_range: tuple[float, float]    # "excluding the outliers": runs with test ppl in this range
    pearson_r_in_range: float


_C_GRID = tuple(0.5 * x for x in range(-4, 5))                 # {0.5x | x in [-4, 4]}
GSS_GRID = {   # [SB] p. 3 and Figure 2
    "ptb": GridCorrelation(_C_GRID, tuple(0.25 * x for x in range(5, 13)), 0.48, (56.6, 57.6), 0.24),
    "wikitext-2": GridCorrelation(_C_GRID, tuple(0.5 * x for x in range(3, 7)), 0.53, (64.0, 65.0), 0.21),
}

# ---------------------------------------------------------------- [SB] SM section 5: Tables 14-16


@dataclass(frozen=True)
class RobustnessReference:
    contexts: int                     # the first 10,000 contexts of PTB's test set, MoS (SM 5.1)
    press_rank: int                   # of that 10,000 x 10,000 log-P matrix
    keep: int                         # singular values kept (Algorithms 1 and 2)
    reconstruction: tuple             # SM Table 14: (iteration, Press rank, error x 1e-28)
    noise_press_rank: dict            # SM Table 15: c -> Press rank (its three sub-tables merged)
    noise_effective_rank: dict        # SM Table 16: c -> effective ranks for eps 1e-3, 1e-4, 1e-5


ROBUSTNESS = RobustnessReference(
    contexts=10_000, press_rank=8_933, keep=10,
    reconstruction=tuple((i, 10, e) for i, e in enumerate(
        (0.97, 0.99, 1.01, 1.05, 1.08, 1.10, 1.13, 1.17, 1.23, 1.28), start=1)),
    noise_press_rank={1e-2: 10_000, 1e-4: 10_000, 1e-8: 10_000, 1e-16: 9_998, 1e-20: 9_899,
                      1e-21: 9_681, 1e-22: 9_001, 1e-23: 6_869, 1e-24: 1_159, 1e-25: 10, 1e-26: 10,
                      1e-28: 10, 1e-32: 10},
    noise_effective_rank={c: (7, 10, 10) for c in (1e-20, 1e-21, 1e-22, 1e-23, 1e-24, 1e-25)},
)
