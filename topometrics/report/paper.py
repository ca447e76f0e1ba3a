"""The paper's numbers: Tables 1-8 of "Topological Persistence of Transformer Weight Spaces".

Each table is a DataFrame whose value columns start with ``paper``, keyed by the column (``rung``,
``step``, ``fraction``/``method``, ``target``) the report joins our values on.
"""

import pandas as pd

# Table 1: configurations, parameter counts and final WikiText-2 validation loss.
PAPER_TABLE1 = pd.DataFrame(
    [
        ("tiny", 2936, 2.466),
        ("small", 7408, 2.099),
        ("medium", 20640, 1.853),
        ("large", 46368, 1.653),
        ("xl", 97200, 1.468),
    ],
    columns=["rung", "paper n_params", "paper final loss"],
)
# Table 2: Spearman rho(VR H0 total persistence, loss) with p and 95% bootstrap CI.
PAPER_TABLE2 = pd.DataFrame(
    [
        ("tiny", -0.590, 5.2e-6, -0.796, -0.350),
        ("small", -0.854, 1.7e-15, -0.938, -0.710),
        ("medium", -0.866, 2.3e-16, -0.946, -0.713),
        ("large", -0.900, 3.0e-19, -0.966, -0.769),
        ("xl", -0.907, 4.7e-20, -0.970, -0.790),
    ],
    columns=["rung", "paper rho", "paper p", "paper ci_low", "paper ci_high"],
)
# Table 3: Spearman rho(mean neural persistence, loss).
PAPER_TABLE3 = pd.DataFrame(
    [
        ("tiny", -0.312, 0.026),
        ("small", 0.031, 0.829),
        ("medium", 0.659, 1.5e-7),
        ("large", 0.615, 1.6e-6),
        ("xl", 0.530, 6.4e-5),
    ],
    columns=["rung", "paper rho", "paper p"],
)
# Table 4: Spearman rho(VR H1 total persistence, loss).
PAPER_TABLE4 = pd.DataFrame(
    [
        ("tiny", -0.641, 4.1e-7),
        ("small", -0.636, 5.2e-7),
        ("medium", -0.580, 8.0e-6),
        ("large", -0.492, 2.5e-4),
        ("xl", 0.053, 0.714),
    ],
    columns=["rung", "paper rho", "paper p"],
)
# Table 5: final-loss prediction MAE per fraction; the paper's three methods mapped onto ours.
PAPER_TABLE5 = pd.DataFrame(
    [
        (0.2, "loss_power_law", 0.1064, None), (0.2, "topology", 0.2634, None), (0.2, "loss_topology", 0.1486, -39.7),
        (0.3, "loss_power_law", 0.1011, None), (0.3, "topology", 0.1499, None), (0.3, "loss_topology", 0.0903, 10.6),
        (0.5, "loss_power_law", 0.0860, None), (0.5, "topology", 0.0554, None), (0.5, "loss_topology", 0.0610, 29.0),
    ],
    columns=["fraction", "method", "paper mae", "paper improvement %"],
)  # fmt: skip
# Table 6: step of max |dNP| and the diminishing-returns step (10% of the peak), of 5,000 steps.
PAPER_TABLE6 = pd.DataFrame(
    [("tiny", 300, 800), ("small", 300, 400), ("medium", 300, 1800), ("large", 200, 1500), ("xl", 300, 1600)],
    columns=["rung", "paper peak_step", "paper diminishing_step"],
)
# Table 7: power laws f(N) = a N^b + c of final-checkpoint values.
PAPER_TABLE7 = pd.DataFrame(
    [
        ("val_loss", -0.144, 0.997, -1.00, "< 1e-24"),
        ("vr_tp0", 0.204, 0.852, 0.90, 0.037),
        ("np_norm", -0.024, 0.266, -0.30, 0.624),
    ],
    columns=["target", "paper exponent", "paper r2", "paper rho", "paper p"],
)
# Table 8: Pythia-14m across training (NP mean/std over layers, H0 total persistence).
PAPER_TABLE8 = pd.DataFrame(
    [
        (0, 0.338, 0.029, 69.7), (1000, 0.377, 0.067, 69.4), (5000, 0.484, 0.132, 70.9), (10000, 0.531, 0.147, 69.8),
        (50000, 0.611, 0.146, 54.4), (100000, 0.627, 0.140, 46.1), (143000, 0.636, 0.132, 45.4),
    ],
    columns=["step", "paper NP mean", "paper NP std", "paper H0 total"],
)  # fmt: skip
